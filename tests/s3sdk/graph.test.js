// graph.test.js: the graph path of QueryVectors through the official AWS SDK for JavaScript
// (docs/api.md "The graph path"). On a local cluster of 2 MN + 2 CN with redundancy 2:
//   - a seed image of GRAPH_ROWS / 10 (at least 1,000) x 128 vectors with metadata is
//     bulk-imported with `dmann load --bucket --name --keys --metadata --spare` (rows put
//     through the compute nodes, the graph placed bound to the index, its graph mark set);
//   - through the SDK, alternating between the two compute nodes' gateways: GRAPH_ROWS new
//     rows with metadata (the tail, which the online indexer moves into the graph), 200
//     imported keys put again with new vectors, 200 imported and 50 written keys deleted;
//   - while the online indexer moves the tail into the graph, and again once it is done
//     (dmann_cn_s3_index_lag_rows 0, every written row counted in
//     dmann_cn_s3_indexed_rows_total): 200 queries without a filter, 200 with a 50% filter
//     and 200 with a 10% filter have recall@10 >= 0.95 against a brute force computed here
//     over the live rows; no deleted key comes back; a re-put key comes back only with its
//     new vector's distance; every result passes its filter;
//   - a sample of 2,000 acknowledged vectors (imported, tail, re-put), taken as they are
//     acknowledged, each finds itself first (after indexing: through the graph, the tail is
//     empty), but for at most 0.01% of the rows (over all self-finds), each still stored
//     with its vector;
//   - the compute nodes' dmann_cn_s3_graph_queries_total shows the graph path served the
//     queries (at least 90% of the unfiltered and 50%-filtered ones);
//   - a memory node SIGKILLed and restarted (its rows renumbered by recovery): the same
//     queries again, still served by the graph path, same recall;
//   - every node SIGKILLed at once and started again (the graph comes back from the memory
//     nodes' snapshots, the marks and key logs from the flat stores' logs): every sampled
//     vector and 2,000 more written rows still find themselves first (the same 0.01%),
//     recall as before,
//     every acknowledged row (all of them) is stored with its vector, and all but at most
//     0.01% (what the HNSW search may miss) are among the top 10 of their own vector
//     (queried through libdmann, `dmann query`, the native protocol to the same gateways'
//     compute nodes: one SDK request per row would take most of the test's time).
// Both compute nodes run the online indexer, each on the rows whose key it wins.
// Environment: DMANN_BIN_DIR (dmann, dmann-mn, dmann-cn), S3SDK_NODE_MODULES, GRAPH_ROWS
// (default 50000; meson sets 30000, the ASan build 10000), GRAPH_M (the seed image's M, default 16: the
// online indexer keeps the image's M; bench/s3/sdk.sh sets 32 at 200,000 rows, see its
// header). Run by tests/s3sdk/run.sh graph.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');

const sdk = require(path.join(process.env.S3SDK_NODE_MODULES, '@aws-sdk/client-s3vectors'));
const BINDIR = process.env.DMANN_BIN_DIR;
const DMANN = path.join(BINDIR, 'dmann');
const TAIL = Number(process.env.GRAPH_ROWS || 50000);       // written through the SDK
const N = Math.max(1000, Math.floor(TAIL / 10));              // the imported seed
const GRAPH_M = Number(process.env.GRAPH_M || 16);
const REPUT = 200, DEL = 200, DEL_TAIL = 50, NQ = 200, K = 10, DIM = 128;
const BUCKET = 'graph-bkt', INDEX = 'graph-idx';
// Rows of n the HNSW search may fail to find by their own vector: 0.01% (see the self-finds).
const searchMissAllowed = (n) => Math.floor(n / 10000);

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dmann-graph-'));
const cdir = path.join(tmp, 'cluster');
after(() => {
  try { execFileSync(DMANN, ['local', 'down', '--dir', cdir], { stdio: 'ignore' }); } catch {}
  if (!process.env.DMANN_KEEP_TEST_DIR) fs.rmSync(tmp, { recursive: true, force: true });
});

function readFbin(file) {
  const b = fs.readFileSync(file);
  const n = b.readInt32LE(0), d = b.readInt32LE(4);
  const v = new Float32Array(b.buffer.slice(b.byteOffset + 8, b.byteOffset + 8 + n * d * 4));
  return { n, d, v };
}

function writeFbin(file, v, n, d) {
  const h = Buffer.alloc(8);
  h.writeInt32LE(n, 0);
  h.writeInt32LE(d, 4);
  fs.writeFileSync(file, Buffer.concat([h, Buffer.from(v.buffer, v.byteOffset, n * d * 4)]));
}

function l2(a, ao, b, bo) {
  let s = 0;
  for (let j = 0; j < DIM; j++) { const t = a[ao + j] - b[bo + j]; s += t * t; }
  return s;
}

const meta = (i) => ({ cat: `c${i % 10}`, half: i % 2, pct: i % 100 });

// The live rows, as the test acknowledged them: key -> { v (Float32Array), m }.
const live = new Map();
const deleted = new Set();
const reput = new Set();
let ini, cns = [], clients = [], base, queries;

function clientOf(port) {
  return new sdk.S3VectorsClient({
    endpoint: `http://127.0.0.1:${port}`, region: 'us-east-1', maxAttempts: 3,
    credentials: { accessKeyId: 'DMANNLOCALTEST',
      secretAccessKey: fs.readFileSync(path.join(cdir, 's3.secret'), 'utf8').trim() },
  });
}

function metric(port, name) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: '/metrics' }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => {
        const m = body.match(new RegExp(`^${name}\\{[^}]*\\} (\\d+)$`, 'm'));
        resolve(m ? Number(m[1]) : 0);
      });
    }).on('error', reject);
  });
}

async function sumMetric(name) {
  let v = 0;
  for (const c of cns) v += await metric(c.metrics, name);
  return v;
}

// Until the online indexer has moved every tail row into the graph (at most 600 s, or
// 10 ms per row for the bench's larger runs).
const IX_WAIT_MS = Math.max(600000, TAIL * 10);
async function waitIndexed(minRows) {
  const t = Date.now();
  for (;;) {
    const lag = await sumMetric('dmann_cn_s3_index_lag_rows');
    const rows = await sumMetric('dmann_cn_s3_indexed_rows_total');
    if (lag === 0 && rows >= minRows) return { rows, s: (Date.now() - t) / 1e3 };
    assert.ok(Date.now() - t < IX_WAIT_MS, `indexing not done after ${IX_WAIT_MS / 1000} s: ` +
      `lag ${lag}, ${rows} rows`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

async function graphCounters() {
  let q = 0, fb = 0, err = 0, pe = 0;
  for (const c of cns) {
    q += await metric(c.metrics, 'dmann_cn_s3_graph_queries_total');
    fb += await metric(c.metrics, 'dmann_cn_s3_graph_fallbacks_total');
    err += await metric(c.metrics, 'dmann_cn_s3_graph_errors_total');
    pe += await metric(c.metrics, 'dmann_cn_s3_graph_planned_exact_total');
  }
  return { q, fb, err, pe };
}

function sameMeta(a, b) {
  const ka = Object.keys(a || {}).sort(), kb = Object.keys(b || {}).sort();
  return ka.length === kb.length && ka.every((k, i) => k === kb[i] && a[k] === b[k]);
}

function matches(m, filter) {
  if (!filter) return true;
  return Object.entries(filter).every(([k, v]) => m[k] === v);
}

// Brute force over the live rows: the K nearest keys (L2) passing filter, with distances.
function brute(qv, qo, filter) {
  const best = [];
  for (const [key, row] of live) {
    if (!matches(row.m, filter)) continue;
    const d = l2(qv, qo, row.v, 0);
    if (best.length < K || d < best[best.length - 1][1]) {
      best.push([key, d]);
      best.sort((a, b) => a[1] - b[1]);
      if (best.length > K) best.pop();
    }
  }
  return best;
}

async function query(c, vec, k, filter) {
  const r = await c.send(new sdk.QueryVectorsCommand({
    vectorBucketName: BUCKET, indexName: INDEX, topK: k, returnDistance: true,
    returnMetadata: true, queryVector: { float32: Array.from(vec) }, ...(filter ? { filter } : {}),
  }));
  return r.vectors;
}

// Recall@10 of NQ queries with filter against the brute force; checks every result.
async function recallRun(filter) {
  let hit = 0, total = 0;
  for (let i = 0; i < NQ; i++) {
    const qv = queries.v.subarray(i * DIM, (i + 1) * DIM);
    const got = await query(clients[i % 2], qv, K, filter);
    const want = brute(queries.v, i * DIM, filter);
    const keys = new Set();
    for (const g of got) {
      assert.ok(!deleted.has(g.key), `deleted key ${g.key} returned`);
      assert.ok(!keys.has(g.key), `key ${g.key} returned twice`);
      keys.add(g.key);
      const row = live.get(g.key);
      assert.ok(row, `unknown key ${g.key}`);
      assert.ok(matches(g.metadata, filter), `${g.key} fails the filter`);
      const d = Math.sqrt(l2(queries.v, i * DIM, row.v, 0));
      assert.ok(Math.abs(g.distance - d) <= 1e-3 * Math.max(1, d),
        `${g.key}: distance ${g.distance}, its current vector is at ${d}` +
        (reput.has(g.key) ? ' (re-put key)' : ''));
    }
    const wk = new Set(want.map((w) => w[0]));
    for (const g of got) hit += wk.has(g.key) ? 1 : 0;
    total += want.length;
  }
  return hit / total;
}

test('bulk import, tail writes, re-puts, deletes, queries on the graph path', async () => {
  const t0 = Date.now();
  // Regions: 512 MiB (the default) hold the graph of 55,000 rows many times over; the bench
  // (bench/s3/sdk.sh) runs 220,000.
  const region = Math.max(512, Math.ceil(TAIL / 100000) * 512);
  execFileSync(DMANN, ['local', 'up', '--mn', '2', '--cn', '2', '--dir', cdir, '--redundancy',
    '2', '--region-mb', String(region), '--s3-set', 'graph_min_rows=1000',
    // GRAPH_S3_SET (bench/s3/sdk.sh): more [s3] settings, "k=v[,k=v...]"
    ...(process.env.GRAPH_S3_SET || '').split(',').filter(Boolean)
      .flatMap((kv) => ['--s3-set', kv])],
  { stdio: ['ignore', 'ignore', 'inherit'] });
  const text = fs.readFileSync(path.join(cdir, 'cluster.ini'), 'utf8');
  for (const m of text.matchAll(/^\[cn\.(\d+)\]\naddress = [^\n]+\nmetrics = 127\.0\.0\.1:(\d+)\nhttp = 127\.0\.0\.1:(\d+)$/mg))
    cns.push({ id: Number(m[1]), metrics: Number(m[2]), http: Number(m[3]) });
  assert.equal(cns.length, 2, 'two compute nodes with metrics and http in cluster.ini');
  ini = path.join(cdir, 'cluster.ini');
  clients = cns.map((c) => clientOf(c.http));

  // Data: N + TAIL + REPUT vectors of a Gaussian mixture (dmann gen), NQ queries.
  execFileSync(DMANN, ['gen', '--kind', 'sift', '--n', String(N + TAIL + REPUT), '--nq',
    String(NQ), '--seed', '7', '--out', path.join(tmp, 'data')], { stdio: 'ignore' });
  base = readFbin(path.join(tmp, 'data', 'base.fbin'));
  queries = readFbin(path.join(tmp, 'data', 'query.fbin'));
  assert.equal(base.d, DIM);
  writeFbin(path.join(tmp, 'import.fbin'), base.v, N, DIM);
  const keys = [], metas = [];
  for (let i = 0; i < N; i++) {
    keys.push(`k${i}`);
    metas.push(JSON.stringify(meta(i)));
    live.set(`k${i}`, { v: base.v.slice(i * DIM, (i + 1) * DIM), m: meta(i) });
  }
  fs.writeFileSync(path.join(tmp, 'keys.txt'), keys.join('\n') + '\n');
  fs.writeFileSync(path.join(tmp, 'meta.txt'), metas.join('\n') + '\n');
  execFileSync(DMANN, ['build', '--base', path.join(tmp, 'import.fbin'), '--metric', 'l2',
    '--M', String(GRAPH_M), '--efc', '100', '--threads', '2', '--out', path.join(tmp, 'idx.hnsw')],
  { stdio: 'ignore' });
  const t1 = Date.now();
  const out = execFileSync(DMANN, ['load', '--config', ini, '--index', path.join(tmp, 'idx.hnsw'),
    '--bucket', BUCKET, '--name', INDEX, '--vectors', path.join(tmp, 'import.fbin'),
    '--keys', path.join(tmp, 'keys.txt'), '--metadata',
    path.join(tmp, 'meta.txt'), '--spare', String(TAIL + REPUT + 1000)], { encoding: 'utf8' });
  assert.match(out, /rows 0\.\.\d+ are in graph \d+, generation \d+/);
  console.log(`FIGURES import: ${N} x ${DIM} in ${((Date.now() - t1) / 1e3).toFixed(1)} s ` +
    `(gen + build before it: ${((t1 - t0) / 1e3).toFixed(1)} s)`);
  // The compute nodes pick the graph up within their refresh period.
  await new Promise((r) => setTimeout(r, 2500));

  // The self-find sample: vectors taken as they are acknowledged.
  const sample = [];
  for (let i = 0; i < Math.min(1000, N); i++) {
    const j = Math.floor((i * 7919) % N);
    sample.push(`k${j}`);
  }

  // Writes through the SDK, alternating gateways.
  const t2 = Date.now();
  for (let at = 0; at < TAIL; at += 100) {
    const vectors = [];
    for (let i = at; i < at + 100; i++) {
      const v = base.v.slice((N + i) * DIM, (N + i + 1) * DIM);
      vectors.push({ key: `t${i}`, data: { float32: Array.from(v) }, metadata: meta(N + i) });
    }
    await clients[(at / 100) % 2].send(new sdk.PutVectorsCommand({ vectorBucketName: BUCKET,
      indexName: INDEX, vectors }));
    for (const x of vectors) {
      live.set(x.key, { v: Float32Array.from(x.data.float32), m: x.metadata });
      if (sample.length < 1800 && Number(x.key.slice(1)) % 14 === 0) sample.push(x.key);
    }
  }
  for (let at = 0; at < REPUT; at += 50) {
    const vectors = [];
    for (let i = at; i < at + 50; i++) {
      const key = `k${(i * 131 + 17) % N}`;
      const v = base.v.slice((N + TAIL + i) * DIM, (N + TAIL + i + 1) * DIM);
      vectors.push({ key, data: { float32: Array.from(v) }, metadata: live.get(key).m });
    }
    await clients[(at / 50) % 2].send(new sdk.PutVectorsCommand({ vectorBucketName: BUCKET,
      indexName: INDEX, vectors }));
    for (const x of vectors) {
      live.set(x.key, { v: Float32Array.from(x.data.float32), m: x.metadata });
      reput.add(x.key);
      if (sample.length < 2000) sample.push(x.key);
    }
  }
  const dels = [];
  for (let i = 0; i < DEL; i++) {
    const key = `k${(i * 257 + 5) % N}`;
    if (!reput.has(key) && !sample.includes(key)) dels.push(key);
  }
  for (let i = 0; i < DEL_TAIL; i++) {
    const key = `t${2 * i + 1}`;
    dels.push(key);
  }
  for (let at = 0; at < dels.length; at += 100) {
    await clients[1].send(new sdk.DeleteVectorsCommand({ vectorBucketName: BUCKET,
      indexName: INDEX, keys: dels.slice(at, at + 100) }));
  }
  for (const k of dels) { live.delete(k); deleted.add(k); }
  console.log(`FIGURES writes: ${TAIL} new, ${REPUT} re-put, ${dels.length} deleted through ` +
    `the SDK in ${((Date.now() - t2) / 1e3).toFixed(1)} s; ${live.size} live rows`);

  const lag0 = await sumMetric('dmann_cn_s3_index_lag_rows');
  const idx0 = await sumMetric('dmann_cn_s3_indexed_rows_total');
  console.log(`FIGURES before the first round: ${idx0} rows indexed, ${lag0} past the mark ` +
    '(at the indexer\'s last look)');
  const c0 = await graphCounters();
  const t3 = Date.now();
  const rNone = await recallRun(null);
  const c1 = await graphCounters();
  const rHalf = await recallRun({ half: 0 });
  const c2 = await graphCounters();
  const rCat = await recallRun({ cat: 'c3' });
  const c3 = await graphCounters();
  const qs = (Date.now() - t3) / 1e3;
  const idx1 = await sumMetric('dmann_cn_s3_indexed_rows_total');
  console.log(`FIGURES rows indexed during the first round: ${idx1 - idx0}`);
  console.log(`FIGURES recall@10 (while indexing): ${rNone.toFixed(4)} unfiltered, ${rHalf.toFixed(4)} half, ` +
    `${rCat.toFixed(4)} cat (10%); ${3 * NQ} queries in ${qs.toFixed(1)} s; graph path ` +
    `${c1.q - c0.q}/${c2.q - c1.q}/${c3.q - c2.q} of ${NQ} each, then sent to the exact ` +
    `path ${c1.fb - c0.fb}/${c2.fb - c1.fb}/${c3.fb - c2.fb}, sent there by the filter ` +
    `estimate ${c1.pe - c0.pe}/${c2.pe - c1.pe}/${c3.pe - c2.pe}, graph errors ${c3.err - c0.err}`);
  assert.ok(rNone >= 0.95, `recall@10 without a filter ${rNone}`);
  assert.ok(rHalf >= 0.95, `recall@10 with the 50% filter ${rHalf}`);
  assert.ok(rCat >= 0.95, `recall@10 with the 10% filter ${rCat}`);
  assert.ok(c1.q - c0.q >= 0.9 * NQ, `graph path served ${c1.q - c0.q} of ${NQ} unfiltered`);
  assert.ok(c2.q - c1.q >= 0.9 * NQ, `graph path served ${c2.q - c1.q} of ${NQ} half-filtered`);
  assert.equal(c3.err - c0.err, 0, 'graph searches failed');

  // Indexing done: the tail is in the graph, the same checks again.
  const ixd = await waitIndexed(TAIL - DEL_TAIL);
  const snaps = await sumMetric('dmann_cn_s3_index_snapshots_total');
  const insMs = await sumMetric('dmann_cn_s3_index_insert_milliseconds_total');
  const perCn = [];
  for (const c of cns) perCn.push(await metric(c.metrics, 'dmann_cn_s3_indexed_rows_total'));
  console.log(`FIGURES indexed: ${ixd.rows} rows in the graph ${ixd.s.toFixed(1)} s after the ` +
    `first recall round (by the compute nodes' indexers: ${perCn.join(' + ')}; ${snaps} ` +
    `graph snapshots; inserts at ${(ixd.rows / Math.max(insMs, 1) * 1e3).toFixed(0)} rows/s ` +
    'per indexer)');
  const c6 = await graphCounters();
  const tail0 = await sumMetric('dmann_cn_s3_graph_tail_rows_total');
  const iNone = await recallRun(null);
  const c7 = await graphCounters();
  const iHalf = await recallRun({ half: 0 });
  const c8 = await graphCounters();
  const iCat = await recallRun({ cat: 'c3' });
  const c9 = await graphCounters();
  // A 1% filter: the cardinality estimate sends every query straight to the exact path.
  const iPct = await recallRun({ pct: 7 });
  const cP = await graphCounters();
  console.log(`FIGURES recall@10 (indexed): ${iNone.toFixed(4)} unfiltered, ` +
    `${iHalf.toFixed(4)} half, ${iCat.toFixed(4)} cat (10%), ${iPct.toFixed(4)} pct (1%); ` +
    `graph path ${c7.q - c6.q}/${c8.q - c7.q}/${c9.q - c8.q}/${cP.q - c9.q} of ${NQ} each, ` +
    `exact after the graph ${c7.fb - c6.fb}/${c8.fb - c7.fb}/${c9.fb - c8.fb}/` +
    `${cP.fb - c9.fb}, exact by the filter estimate ${c7.pe - c6.pe}/${c8.pe - c7.pe}/` +
    `${c9.pe - c8.pe}/${cP.pe - c9.pe}, graph errors ${cP.err - c6.err}`);
  assert.ok(iPct >= 0.95, `indexed: recall@10 with the 1% filter ${iPct}`);
  assert.equal(cP.pe - c9.pe, NQ, 'the 1% filter goes to the exact path by the estimate');
  assert.equal(cP.fb - c9.fb, 0, 'no 1% query tried the graph first');
  assert.equal(c7.pe - c6.pe, 0, 'unfiltered queries never use the estimate');
  assert.equal(c8.pe - c7.pe, 0, 'the 50% filter stays on the graph path');
  const tail1 = await sumMetric('dmann_cn_s3_graph_tail_rows_total');
  console.log(`FIGURES tail rows scanned by the ${NQ} unfiltered queries after indexing: ` +
    `${tail1 - tail0}`);
  assert.equal(tail1 - tail0, 0, 'indexed rows are still scanned as the tail (every ' +
    'replica\'s mark must have moved past them)');
  assert.ok(iNone >= 0.95, `indexed: recall@10 without a filter ${iNone}`);
  assert.ok(iHalf >= 0.95, `indexed: recall@10 with the 50% filter ${iHalf}`);
  assert.ok(iCat >= 0.95, `indexed: recall@10 with the 10% filter ${iCat}`);
  assert.ok(c7.q - c6.q >= 0.9 * NQ, `indexed: graph path served ${c7.q - c6.q} unfiltered`);
  assert.ok(c8.q - c7.q >= 0.9 * NQ, `indexed: graph path served ${c8.q - c7.q} half-filtered`);
  assert.equal(c9.err - c6.err, 0, 'indexed: graph searches failed');

  // Self-find: each sampled acknowledged vector is its own nearest neighbour, but for what
  // the HNSW search itself may miss: the same 0.01% of the rows as the final check below
  // (distinct rows over every self-find of the test; 3 at 30,000 rows), each of them still
  // stored with its acknowledged vector (GetVectors). A lost batch or a lost watermark
  // loses far more. Why a row can be missed (2026-12-07, docs/status.md): two rows that are
  // each other's nearest, inserted side by side, may never link, and one of them keep only
  // an in-link from afar; t21933 was such a row in about half the runs, found neither by
  // the graph nor lost (its record, key and mark were whole).
  const selfMissed = new Set();
  const selfFind = async (keys, what) => {
    let found = 0;
    const miss = [];
    for (let i = 0; i < keys.length; i++) {
      const got = await query(clients[i % 2], live.get(keys[i]).v, 1, null);
      if (got.length && got[0].key === keys[i]) found++;
      else miss.push(keys[i]);
    }
    console.log(`FIGURES self-find ${what}: ${found} of ${keys.length}` +
      (miss.length ? `; not first: ${miss.slice(0, 10).join(' ')}` : ''));
    for (const k of miss) {
      const r = await clients[0].send(new sdk.GetVectorsCommand({ vectorBucketName: BUCKET,
        indexName: INDEX, keys: [k], returnData: true }));
      const g = r.vectors.find((x) => x.key === k);
      assert.ok(g && g.data.float32.every((x, j) => x === live.get(k).v[j]),
        `${what}: ${k}, not found by its vector, is not stored with it either`);
      selfMissed.add(k);
    }
    const allowed = searchMissAllowed(live.size);
    assert.ok(selfMissed.size <= allowed, `${what}: acknowledged vectors that do not find ` +
      `themselves: ${[...selfMissed].slice(0, 10).join(' ')} (${selfMissed.size} in all, at ` +
      `most ${allowed})`);
  };
  await selfFind(sample, 'sample (indexed)');

  // A memory node SIGKILLed and restarted: recovery renumbers its rows and the graph mark.
  execFileSync(DMANN, ['local', 'kill', '--dir', cdir, 'mn0'], { stdio: 'ignore' });
  // The killed process may still hold its data directory's lock for a moment while the
  // kernel tears it down (seen under ASan): start again until it takes it, at most 20 s.
  for (let i = 0; ; i++) {
    try {
      execFileSync(DMANN, ['local', 'start', '--dir', cdir, 'mn0'], { stdio: 'ignore' });
      break;
    } catch (e) {
      if (i >= 40) throw e;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  await new Promise((r) => setTimeout(r, 3000));
  const c4 = await graphCounters();
  const rAfter = await recallRun(null);
  const c5 = await graphCounters();
  console.log(`FIGURES after mn0's restart: recall@10 ${rAfter.toFixed(4)}, graph path ` +
    `${c5.q - c4.q} of ${NQ}`);
  assert.ok(rAfter >= 0.95, `recall@10 after the restart ${rAfter}`);
  assert.ok(c5.q - c4.q >= 0.9 * NQ, `graph path after the restart: ${c5.q - c4.q}`);

  // Every node SIGKILLed at once (a power cut), then started again: the graph from the
  // memory nodes' snapshots, marks and key logs from the flat stores' logs.
  for (const n of ['cn0', 'cn1', 'mn0', 'mn1'])
    execFileSync(DMANN, ['local', 'kill', '--dir', cdir, n], { stdio: 'ignore' });
  for (const n of ['mn0', 'mn1', 'cn0', 'cn1']) {
    for (let i = 0; ; i++) {
      try {
        execFileSync(DMANN, ['local', 'start', '--dir', cdir, n], { stdio: 'ignore' });
        break;
      } catch (e) {
        if (i >= 40) throw e;
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  }
  await new Promise((r) => setTimeout(r, 4000));
  const c10 = await graphCounters();
  const rCut = await recallRun(null);
  const c11 = await graphCounters();
  console.log(`FIGURES after a full-cluster SIGKILL: recall@10 ${rCut.toFixed(4)}, graph path ` +
    `${c11.q - c10.q} of ${NQ}`);
  assert.ok(rCut >= 0.95, `recall@10 after the full restart ${rCut}`);
  assert.ok(c11.q - c10.q >= 0.9 * NQ, `graph path after the full restart: ${c11.q - c10.q}`);
  const sampled = new Set(sample);
  const more = [...live.keys()].filter((k, i) => k[0] === 't' && !sampled.has(k) &&
    Number(k.slice(1)) % Math.max(1, Math.floor(TAIL / 2000)) === 3).slice(0, 2000);
  await selfFind(sample, 'sample (after the full restart)');
  await selfFind(more, 'more written rows (after the full restart)');

  // Every acknowledged row (the seed and every live tail row, with its last acknowledged
  // vector) after the full restart: each is still stored with that vector (GetVectors) and
  // found by its own vector among the top 10. These queries go through libdmann (`dmann
  // query`: the native protocol to the same compute nodes, the same planner and graph path
  // as QueryVectors, queries in flight on both CNs): one SDK request per row would take most
  // of CI's time for this test; the SDK's QueryVectors self-finds the samples above.
  // A lost watermark loses whole batches; what the HNSW search alone may miss (a node the
  // graph has grown around) is allowed up to 0.01% of the rows, and each such row must
  // still be readable with its acknowledged vector.
  const all = [...live.keys()];
  let found = 0, first = 0, next = 0;
  const missed = [];
  const tAll = Date.now();
  {
    const allf = path.join(tmp, 'all.fbin');
    const av = new Float32Array(all.length * DIM);
    all.forEach((k, i) => av.set(live.get(k).v, i * DIM));
    writeFbin(allf, av, all.length, DIM);
    const lines = execFileSync(DMANN, ['query', '--config', ini, '--bucket', BUCKET, '--name',
      INDEX, '--vectors', allf, '--k', String(K)],
    { encoding: 'utf8', maxBuffer: 1 << 30 }).split('\n').filter(Boolean);
    assert.equal(lines.length, all.length, `dmann query answered ${lines.length} of ${all.length}`);
    lines.forEach((l, i) => {
      const t = l.split(' ');
      assert.equal(t[0], `${i}:`, `dmann query: line ${i}: ${l.slice(0, 80)}`);
      const hits = [];
      for (let j = 1; j + 1 < t.length; j += 2) hits.push(t[j]);
      const at = hits.indexOf(all[i]);
      if (at >= 0) found++;
      if (at === 0) first++;
      if (at < 0) missed.push(all[i]);
    });
  }
  // GetVectors of every acknowledged row (not only the missed ones): each must come back
  // with its last acknowledged vector and metadata.
  const wrong = [];
  next = 0;
  await Promise.all(Array.from({ length: 4 }, async (_, w) => {
    for (let at; (at = 100 * next++) < all.length;) {
      const keys = all.slice(at, at + 100);
      const r = await clients[(at / 100 + w) % 2].send(new sdk.GetVectorsCommand({
        vectorBucketName: BUCKET, indexName: INDEX, keys, returnData: true,
        returnMetadata: true }));
      const got = new Map(r.vectors.map((x) => [x.key, x]));
      for (const k of keys) {
        const g = got.get(k);
        if (!g) { wrong.push(`${k} (gone)`); continue; }
        const v = live.get(k).v;
        if (!g.data.float32.every((x, j) => x === v[j]))
          wrong.push(`${k} (another vector${reput.has(k) ? ', re-put key' : ''}` +
            `${missed.includes(k) ? ', not found by its vector' : ''})`);
        else if (!sameMeta(g.metadata, live.get(k).m))
          wrong.push(`${k} (other metadata)`);
      }
    }
  }));
  console.log(`FIGURES GetVectors of every acknowledged row after the full restart: ` +
    `${all.length - wrong.length} of ${all.length} with their acknowledged vector and metadata` +
    (wrong.length ? `; wrong: ${wrong.slice(0, 10).join(' ')}` : ''));
  assert.equal(wrong.length, 0, `acknowledged rows lost or changed: ${wrong.slice(0, 10).join(' ')}`);
  console.log(`FIGURES every acknowledged row after the full restart: ${found} of ` +
    `${all.length} found by their own vector among the top ${K} (${first} first), ` +
    `${((Date.now() - tAll) / 1000).toFixed(0)} s; not found: ` +
    `${missed.length ? missed.slice(0, 10).join(' ') + ' (each stored with its vector)' : 'none'}`);
  assert.ok(missed.length <= searchMissAllowed(all.length), `${missed.length} acknowledged ` +
    `rows not found by their own vector after the full restart, e.g. ${missed.slice(0, 5).join(' ')}`);

  // The graph itself (dmann graph check): no torn record or out-of-range id once the
  // writers are idle, and how many nodes no search can reach.
  const gc = JSON.parse(execFileSync(DMANN, ['graph', 'check', '--config', ini, '--json',
    '--anchors'], { encoding: 'utf8' }));
  console.log(`FIGURES graph check after the full restart: ${gc.ids} ids, ${gc.whole} whole, ` +
    `${gc.torn} torn, ${gc.empty} empty, ${gc.bad_ids} ids out of range, ${gc.edges} edges; ` +
    `${gc.unreachable} unreachable (${gc.no_inlink} without an in-link); nearest in-link over ` +
    `1.5x / 2x / 4x as far as the nearest out-link: ${gc.far_in_links.join(' / ')}` +
    (gc.unreachable_nodes.length ? `: ids ${gc.unreachable_nodes.map((u) => u.id).join(' ')}` : ''));
  assert.equal(gc.torn, 0, 'torn records with every writer idle');
  assert.equal(gc.bad_ids, 0, 'neighbour ids out of range');
  assert.ok(gc.whole >= all.length, `${gc.whole} whole records for ${all.length} rows`);
});
