// s3sdk.test.js: drives the S3 Vectors gateway through the official AWS SDK for JavaScript
// (@aws-sdk/client-s3vectors) on loopback: every operation, paging (nextToken, segments),
// filters, every error shape, query results equal to a brute force computed here, 503 under
// overload, and acknowledged writes surviving kill -9. Two targets:
//   - single: dmann-s3 (gateway and store in one process; kill -9 hits that process);
//   - cluster: `dmann local up --mn 2 --cn 2` (the gateway on each dmann-cn, data on the
//     dmann-mn processes, queries fanned out to W = 2 CNs); kill -9 hits the memory node
//     holding the bucket, which is restarted with `setsid dmann-mn`; the fan-out is also
//     checked with a slow member (hedged) and a dead one (retried elsewhere).
//
// With S3SDK_HTTPS=1 every client talks HTTPS, trusting the gateway's self-signed
// certificate (dmann-s3 --tls-cert/--tls-key with one made here by the openssl CLI; a
// cluster from `dmann local up --https`, which writes DIR/s3.crt).
//
// Environment: S3SDK_TARGET (single | cluster), DMANN_S3_BIN (dmann-s3) or DMANN_BIN_DIR
// (where dmann, dmann-mn, dmann-cn are), S3SDK_NODE_MODULES (where
// @aws-sdk/client-s3vectors is installed). Run by tests/s3sdk/run.sh.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const sdk = require(path.join(process.env.S3SDK_NODE_MODULES, '@aws-sdk/client-s3vectors'));
const BIN = process.env.DMANN_S3_BIN;
const CLUSTER = process.env.S3SDK_TARGET === 'cluster';
const BINDIR = process.env.DMANN_BIN_DIR;
const AK = 'AKIDDMANNTEST';
const SK = 'dmann/test+secret';
const servers = [];
const { execFileSync } = require('node:child_process');
const HTTPS = process.env.S3SDK_HTTPS === '1';
const https = require('node:https');
const { NodeHttpHandler } = require(path.join(process.env.S3SDK_NODE_MODULES,
  '@smithy/node-http-handler'));
// The second and third identities of the policy tests (dmann-s3: --credentials lines with a
// name; a cluster: --s3-identity, keys DMANNID<NAME>).
const IDS = ['alice', 'bob'];

// ---- server lifecycle --------------------------------------------------------------------

// dmann-s3 options -> the environment of a local cluster's nodes.
function clusterEnv(extra) {
  const env = { ...process.env, DMANN_S3_WIDTH: '2' };
  for (let i = 0; i < extra.length; i += 2) {
    const v = extra[i + 1];
    if (extra[i] === '--frag-rows') env.DMANN_FLAT_FRAG_ROWS = v;
    else if (extra[i] === '--queue-depth') env.DMANN_S3_QUEUE_DEPTH = v;
    else if (extra[i] === '--search-threads') env.DMANN_S3_SEARCH_THREADS = v;
    else if (extra[i] === '--width') env.DMANN_S3_WIDTH = v;
    else if (extra[i] === '--env') Object.assign(env, JSON.parse(v));
    // (--up: arguments of dmann local up itself, see upArgs)
  }
  return env;
}

function iniPorts(ini) {
  return [...ini.matchAll(/^http = 127\.0\.0\.1:(\d+)$/mg)].map((m) => Number(m[1]));
}

// dmann-s3 options that `dmann local up` takes as its own.
function upArgs(extra) {
  const out = [];
  for (let i = 0; i < extra.length; i += 2) {
    if (extra[i] === '--up') out.push(...JSON.parse(extra[i + 1]));
  }
  return out;
}

async function startCluster(dir, extra = []) {
  const cdir = path.join(dir, 'cluster');
  const up = upArgs(extra);
  if (HTTPS) up.push('--https');
  for (const n of IDS) up.push('--s3-identity', n);
  execFileSync(path.join(BINDIR, 'dmann'), ['local', 'up', '--mn', '2', '--cn', '2', '--dir',
    cdir, ...up], { env: clusterEnv(extra), stdio: ['ignore', 'ignore', 'inherit'] });
  const ini = fs.readFileSync(path.join(cdir, 'cluster.ini'), 'utf8');
  const srv = { cluster: true, dir, cdir, ini: path.join(cdir, 'cluster.ini'),
    ports: HTTPS ? [...ini.matchAll(/^https = 127\.0\.0\.1:(\d+)$/mg)].map((m) => Number(m[1]))
      : iniPorts(ini), ak: 'DMANNLOCALTEST',
    sk: fs.readFileSync(path.join(cdir, 's3.secret'), 'utf8').trim(), extra, restarted: [],
    ca: HTTPS ? fs.readFileSync(path.join(cdir, 's3.crt')) : null, ids: {} };
  for (const m of ini.matchAll(/^\[s3\.identity\.(\w+)\]\naccess_key = (\w+)$/mg)) {
    srv.ids[m[1]] = { ak: m[2],
      sk: fs.readFileSync(path.join(cdir, `s3.${m[1]}.secret`), 'utf8').trim() };
  }
  srv.port = srv.ports[0];
  servers.push(srv);
  return srv;
}

function pidsOf(srv) {
  const m = new Map();
  for (const l of fs.readFileSync(path.join(srv.cdir, 'pids'), 'utf8').split('\n')) {
    const [pid, name] = l.trim().split(/\s+/);
    if (pid) m.set(name, Number(pid));
  }
  for (const [name, p] of srv.restarted) m.set(name, p.pid);
  return m;
}

function alive(pid) {
  try { process.kill(pid, 0); return true; } catch { return false; }
}

async function waitDead(pid) {
  for (let i = 0; i < 500 && alive(pid); i++) await new Promise((r) => setTimeout(r, 20));
}

// Start memory node id again, in its own session like `setsid dmann-mn` in
// tests/test_cluster.c (detached: the child calls setsid(), and p.pid is dmann-mn itself,
// which the test stops at the end).
function restartMn(srv, id) {
  const log = fs.openSync(path.join(srv.cdir, `mn${id}.restart.log`), 'a');
  const p = spawn(process.env.DMANN_MN_BIN, ['--config', srv.ini, '--id', String(id)],
    { env: clusterEnv(srv.extra), stdio: ['ignore', log, log], detached: true });
  fs.closeSync(log);
  p.unref();
  srv.restarted = srv.restarted.filter(([n]) => n !== `mn${id}`);
  srv.restarted.push([`mn${id}`, p]);
  return p;
}

async function stopCluster(srv, signal) {
  // Processes restarted by the test are not in DIR/pids: stop them first.
  for (const [, p] of srv.restarted) {
    if (alive(p.pid)) { process.kill(p.pid, signal === 'SIGTERM' ? 'SIGTERM' : 'SIGKILL'); }
    await waitDead(p.pid);
  }
  if (signal !== 'SIGTERM') {
    for (const [, pid] of pidsOf(srv)) if (alive(pid)) process.kill(pid, 'SIGKILL');
  }
  execFileSync(path.join(BINDIR, 'dmann'), ['local', 'down', '--dir', srv.cdir],
    { stdio: ['ignore', 'ignore', 'inherit'] });
  servers.splice(servers.indexOf(srv), 1);
  if (signal === 'SIGTERM') {
    // Under ASan a leak or memory error is reported in the node logs.
    for (const f of fs.readdirSync(srv.cdir).filter((n) => n.endsWith('.log'))) {
      const text = fs.readFileSync(path.join(srv.cdir, f), 'utf8');
      assert.ok(!/Sanitizer|runtime error:/.test(text), `${f}: sanitizer report\n${text}`);
    }
  }
}

// A self-signed certificate for 127.0.0.1 (once per run), for dmann-s3 over HTTPS.
let certDir = null;
function testCert() {
  if (certDir) return certDir;
  certDir = fs.mkdtempSync(path.join(os.tmpdir(), 'dmann-s3sdk-cert-'));
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
    '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost',
    '-keyout', path.join(certDir, 'key.pem'), '-out', path.join(certDir, 'cert.pem')],
  { stdio: 'ignore' });
  return certDir;
}

// dmann-s3's identities: the default key and the named ones of IDS.
function singleIds() {
  const ids = {};
  for (const n of IDS) ids[n] = { ak: `AKID${n.toUpperCase()}`, sk: `${n}/secret+key-0123` };
  return ids;
}

async function startServer(dir, extra = []) {
  if (CLUSTER) return startCluster(dir, extra);
  const portFile = path.join(dir, 'port');
  fs.rmSync(portFile, { force: true });
  const own = extra.filter((_, i) => extra[i] !== '--up' && extra[i - 1] !== '--up');
  const ids = singleIds();
  const creds = path.join(dir, 'credentials');
  fs.writeFileSync(creds, `# AK SECRET NAME\n${Object.entries(ids).map(([n, id]) =>
    `${id.ak} ${id.sk} ${n}`).join('\n')}\n`, { mode: 0o600 });
  const tls = HTTPS ? ['--tls-cert', path.join(testCert(), 'cert.pem'), '--tls-key',
    path.join(testCert(), 'key.pem')] : [];
  const proc = spawn(BIN, ['--listen', '127.0.0.1:0', '--data', path.join(dir, 'data'),
    '--access-key', AK, '--secret-key', SK, '--credentials', creds, '--port-file', portFile,
    ...tls, ...own],
  { stdio: ['ignore', 'pipe', 'inherit'] });
  const srv = { proc, dir, exited: new Promise((res) => proc.on('exit', (c, s) => res(s || c))),
    ids, ca: HTTPS ? fs.readFileSync(path.join(testCert(), 'cert.pem')) : null };
  servers.push(srv);
  await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      if (out.includes('listening on')) resolve();
    });
    proc.on('exit', (c) => reject(new Error(`dmann-s3 exited early (${c})`)));
  });
  srv.port = Number(fs.readFileSync(portFile, 'utf8'));
  return srv;
}

async function stopServer(srv, signal = 'SIGTERM') {
  if (srv.cluster) return stopCluster(srv, signal);
  srv.proc.kill(signal);
  const status = await srv.exited;
  servers.splice(servers.indexOf(srv), 1);
  // A clean stop (answer admitted queries, snapshot) exits 0; under ASan also leak-free.
  if (signal === 'SIGTERM') assert.equal(status, 0, 'dmann-s3 did not stop cleanly');
}

after(async () => {
  for (const s of [...servers]) await stopServer(s, 'SIGKILL');
  if (certDir) fs.rmSync(certDir, { recursive: true, force: true });
});

function client(srv, opts = {}) {
  // A path prefix on the endpoint is kept by the SDK: the gateway routes on the last segment.
  const port = srv.ports ? srv.ports[opts.cn || 0] : srv.port;
  const id = opts.id ? srv.ids[opts.id] : null;
  return new sdk.S3VectorsClient({
    endpoint: `${srv.ca ? 'https' : 'http'}://127.0.0.1:${port}${opts.prefix || '/s3v'}`,
    region: 'us-east-1',
    credentials: { accessKeyId: opts.ak || (id && id.ak) || srv.ak || AK,
      secretAccessKey: opts.sk || (id && id.sk) || srv.sk || SK },
    maxAttempts: opts.maxAttempts || 1,
    systemClockOffset: opts.clockOffset || 0,
    ...(srv.ca ? { requestHandler: new NodeHttpHandler({
      httpsAgent: new https.Agent({ ca: srv.ca, keepAlive: true }) }) } : {}),
  });
}

const send = (c, Cmd, input) => c.send(new sdk[Cmd](input));

async function expectError(promise, name, status) {
  try {
    await promise;
  } catch (e) {
    assert.equal(e.name, name, `expected ${name}, got ${e.name}: ${e.message}`);
    assert.equal(e.$metadata.httpStatusCode, status);
    assert.ok(typeof e.message === 'string' && e.message.length > 0);
    return e;
  }
  assert.fail(`expected ${name}`);
}

// ---- data and brute force -----------------------------------------------------------------

function rng(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    return x / 4294967296;
  };
}

const GENRES = ['drama', 'comedy', 'horror', 'documentary'];
const NONFILTER = ['text'];

function makeVectors(n, dim, seed, prefix = 'v') {
  const r = rng(seed);
  const out = [];
  for (let i = 0; i < n; i++) {
    const data = Array.from({ length: dim }, () => Math.fround(r() * 2 - 1));
    const md = {
      genre: GENRES[Math.floor(r() * GENRES.length)],
      year: 1990 + Math.floor(r() * 35),
      rating: Math.round(r() * 50) / 10,
      tags: ['t' + Math.floor(r() * 5), 't' + Math.floor(r() * 5)],
      text: `free text ${i}`,
    };
    if (r() < 0.2) delete md.rating;
    if (r() < 0.1) md.flag = r() < 0.5;
    out.push({ key: `${prefix}${i}`, data: { float32: data }, metadata: md });
  }
  return out;
}

function distance(metric, a, b) {
  let dot = 0, na = 0, nb = 0, l2 = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i];
    l2 += (a[i] - b[i]) * (a[i] - b[i]);
  }
  return metric === 'euclidean' ? Math.sqrt(l2) : 1 - dot / Math.sqrt(na * nb);
}

// The filter semantics of docs/api.md, written independently of the C evaluator.
function evalOp(op, arg, md, k) {
  const has = Object.prototype.hasOwnProperty.call(md, k);
  const vals = has ? (Array.isArray(md[k]) ? md[k] : [md[k]]) : [];
  const eq = (a, b) => typeof a === typeof b && a === b;
  const num = (f) => vals.some((x) => typeof x === 'number' && f(x));
  switch (op) {
    case '$eq': return vals.some((x) => eq(x, arg));
    case '$ne': return !vals.some((x) => eq(x, arg));
    case '$gt': return num((x) => x > arg);
    case '$gte': return num((x) => x >= arg);
    case '$lt': return num((x) => x < arg);
    case '$lte': return num((x) => x <= arg);
    case '$in': return vals.some((x) => arg.some((a) => eq(x, a)));
    case '$nin': return !vals.some((x) => arg.some((a) => eq(x, a)));
    case '$exists': return has === arg;
    default: throw new Error(op);
  }
}

function evalFilter(f, md) {
  return Object.entries(f).every(([k, v]) => {
    if (k === '$and') return v.every((g) => evalFilter(g, md));
    if (k === '$or') return v.some((g) => evalFilter(g, md));
    if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
      return Object.entries(v).every(([op, arg]) => evalOp(op, arg, md, k));
    }
    return evalOp('$eq', v, md, k);
  });
}

function bruteForce(rows, metric, q, k, filter) {
  return rows
    .filter((r) => !filter || evalFilter(filter, r.metadata || {}))
    .map((r) => ({ key: r.key, d: distance(metric, q, r.data.float32) }))
    .sort((a, b) => a.d - b.d)
    .slice(0, k);
}

// Rank-by-rank equality with brute force (recall 1.0): the i-th returned distance equals the
// i-th brute-force distance, and each returned key really has that distance (exact ties may
// be ordered either way, so keys are not compared position by position).
function assertSameAsBruteForce(got, rows, metric, q, k, filter) {
  const want = bruteForce(rows, metric, q, k, filter);
  const byKey = new Map(rows.map((r) => [r.key, r]));
  assert.equal(got.length, want.length, `result count for filter ${JSON.stringify(filter)}`);
  for (let i = 0; i < got.length; i++) {
    const tol = 1e-4 * (1 + Math.abs(want[i].d));
    assert.ok(Math.abs(got[i].distance - want[i].d) <= tol,
      `rank ${i}: ${got[i].distance} vs brute force ${want[i].d}`);
    const row = byKey.get(got[i].key);
    assert.ok(row, `unknown key ${got[i].key}`);
    assert.ok(Math.abs(distance(metric, q, row.data.float32) - got[i].distance) <= tol);
    if (filter) assert.ok(evalFilter(filter, row.metadata), `${got[i].key} fails the filter`);
  }
  const keys = new Set(got.map((h) => h.key));
  assert.equal(keys.size, got.length, 'duplicate keys in a result');
}

// Bulk loading retries 503 (as the SDKs do by default; these clients make one attempt so
// that the error tests see every error): a loaded machine can make a node slow to answer.
async function putAll(c, bucket, index, vectors, batch = 500) {
  for (let i = 0; i < vectors.length; i += batch) {
    for (let attempt = 0; ; attempt++) {
      try {
        await send(c, 'PutVectorsCommand', { vectorBucketName: bucket, indexName: index,
          vectors: vectors.slice(i, i + batch) });
        break;
      } catch (e) {
        if (e.name !== 'ServiceUnavailableException' || attempt >= 4) throw e;
        await new Promise((r) => setTimeout(r, 200 * (attempt + 1)));
      }
    }
  }
}

async function listAll(c, input) {
  const out = [];
  let nextToken;
  let pages = 0;
  do {
    const r = await send(c, 'ListVectorsCommand', { ...input, nextToken });
    out.push(...r.vectors);
    nextToken = r.nextToken;
    pages++;
  } while (nextToken);
  return { vectors: out, pages };
}

// Wait until the gateway can reach the memory node of bucket again (after a restart).
async function waitReady(cl, bucket) {
  for (let i = 0; ; i++) {
    try {
      await send(cl, 'GetVectorBucketCommand', { vectorBucketName: bucket });
      return;
    } catch (e) {
      if (i > 200 || e.name !== 'ServiceUnavailableException') throw e;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

// ---- the tests -----------------------------------------------------------------------------

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dmann-s3sdk-'));
after(() => fs.rmSync(tmp, { recursive: true, force: true }));
let srv;
let c;
let c1;        // the second compute node of a cluster (c otherwise)

test(CLUSTER ? 'start a local cluster (2 MN + 2 CN)' : 'start dmann-s3', async () => {
  srv = await startServer(tmp, ['--frag-rows', '256']);
  c = client(srv);
  c1 = srv.cluster ? client(srv, { cn: 1 }) : c;
});

test('vector buckets: create, get, list with prefix and paging, delete', async () => {
  const arns = [];
  for (const b of ['alpha-1', 'alpha-2', 'alpha-3', 'beta-1']) {
    const r = await send(c, 'CreateVectorBucketCommand', { vectorBucketName: b });
    assert.match(r.vectorBucketArn, new RegExp(`^arn:aws:s3vectors:[^:]+:\\d+:bucket/${b}$`));
    arns.push(r.vectorBucketArn);
  }
  await expectError(send(c, 'CreateVectorBucketCommand', { vectorBucketName: 'alpha-1' }),
    'ConflictException', 409);
  const g = await send(c, 'GetVectorBucketCommand', { vectorBucketArn: arns[1] });
  assert.equal(g.vectorBucket.vectorBucketName, 'alpha-2');
  assert.ok(g.vectorBucket.creationTime instanceof Date);
  assert.ok(Math.abs(g.vectorBucket.creationTime - Date.now()) < 600e3);

  const names = [];
  for await (const page of sdk.paginateListVectorBuckets({ client: c, pageSize: 1 },
    { prefix: 'alpha' })) {
    assert.ok(page.vectorBuckets.length <= 1);
    names.push(...page.vectorBuckets.map((b) => b.vectorBucketName));
  }
  assert.deepEqual(names, ['alpha-1', 'alpha-2', 'alpha-3']);
  await send(c, 'DeleteVectorBucketCommand', { vectorBucketName: 'alpha-3' });
  await expectError(send(c, 'GetVectorBucketCommand', { vectorBucketName: 'alpha-3' }),
    'NotFoundException', 404);
  const all = await send(c, 'ListVectorBucketsCommand', {});
  assert.deepEqual(all.vectorBuckets.map((b) => b.vectorBucketName),
    ['alpha-1', 'alpha-2', 'beta-1']);
});

const B = 'alpha-1';
const DIM = 24;
const rowsCos = makeVectors(1300, DIM, 7, 'c');
const rowsL2 = makeVectors(700, 8, 11, 'e');

test('indexes: create, get, list, conflicts', async () => {
  const r = await send(c, 'CreateIndexCommand', { vectorBucketName: B, indexName: 'cos-idx',
    dataType: 'float32', dimension: DIM, distanceMetric: 'cosine',
    metadataConfiguration: { nonFilterableMetadataKeys: NONFILTER } });
  assert.match(r.indexArn, /bucket\/alpha-1\/index\/cos-idx$/);
  await send(c, 'CreateIndexCommand', { vectorBucketName: B, indexName: 'l2.idx',
    dataType: 'float32', dimension: 8, distanceMetric: 'euclidean' });
  await send(c, 'CreateIndexCommand', { vectorBucketName: B, indexName: 'tmp-idx',
    dataType: 'float32', dimension: 2, distanceMetric: 'euclidean' });
  await expectError(send(c, 'CreateIndexCommand', { vectorBucketName: B, indexName: 'cos-idx',
    dataType: 'float32', dimension: DIM, distanceMetric: 'cosine' }), 'ConflictException', 409);
  const g = await send(c, 'GetIndexCommand', { indexArn: r.indexArn });
  assert.equal(g.index.indexName, 'cos-idx');
  assert.equal(g.index.vectorBucketName, B);
  assert.equal(g.index.dimension, DIM);
  assert.equal(g.index.distanceMetric, 'cosine');
  assert.equal(g.index.dataType, 'float32');
  assert.deepEqual(g.index.metadataConfiguration.nonFilterableMetadataKeys, NONFILTER);
  assert.ok(g.index.creationTime instanceof Date);

  const names = [];
  for await (const p of sdk.paginateListIndexes({ client: c, pageSize: 2 },
    { vectorBucketName: B })) names.push(...p.indexes.map((i) => i.indexName));
  assert.deepEqual(names, ['cos-idx', 'l2.idx', 'tmp-idx']);
  const pre = await send(c, 'ListIndexesCommand', { vectorBucketName: B, prefix: 'l2' });
  assert.deepEqual(pre.indexes.map((i) => i.indexName), ['l2.idx']);
  await expectError(send(c, 'DeleteVectorBucketCommand', { vectorBucketName: B }),
    'ConflictException', 409);
  await send(c, 'DeleteIndexCommand', { vectorBucketName: B, indexName: 'tmp-idx' });
  await expectError(send(c, 'GetIndexCommand', { vectorBucketName: B, indexName: 'tmp-idx' }),
    'NotFoundException', 404);
});

test('PutVectors and GetVectors round trip data and metadata', async () => {
  await putAll(c, B, 'cos-idx', rowsCos);
  await putAll(c, B, 'l2.idx', rowsL2);
  const keys = ['c5', 'nope', 'c1299', 'c0'];
  const r = await send(c, 'GetVectorsCommand', { vectorBucketName: B, indexName: 'cos-idx',
    keys, returnData: true, returnMetadata: true });
  assert.deepEqual(r.vectors.map((v) => v.key), ['c5', 'c1299', 'c0']);
  for (const v of r.vectors) {
    const want = rowsCos[Number(v.key.slice(1))];
    assert.deepEqual(v.data.float32.map(Math.fround), want.data.float32);
    assert.deepEqual(v.metadata, want.metadata);
  }
  const bare = await send(c, 'GetVectorsCommand', { vectorBucketName: B, indexName: 'cos-idx',
    keys: ['c1'] });
  assert.equal(bare.vectors[0].data, undefined);
  assert.equal(bare.vectors[0].metadata, undefined);
});

test('ListVectors: nextToken paging and segments cover every key once', async () => {
  const { vectors, pages } = await listAll(c, { vectorBucketName: B, indexName: 'cos-idx',
    maxResults: 300, returnMetadata: true });
  assert.equal(pages, 5);
  assert.deepEqual(vectors.map((v) => v.key).sort(), rowsCos.map((r) => r.key).sort());
  assert.deepEqual(vectors[0].metadata, rowsCos.find((r) => r.key === vectors[0].key).metadata);
  assert.equal(vectors[0].data, undefined);

  const seen = new Set();
  for (let s = 0; s < 4; s++) {
    const part = await listAll(c, { vectorBucketName: B, indexName: 'cos-idx', maxResults: 100,
      segmentCount: 4, segmentIndex: s, returnData: true });
    assert.ok(part.vectors.length > 0);
    for (const v of part.vectors) {
      assert.ok(!seen.has(v.key), `${v.key} in two segments`);
      seen.add(v.key);
      assert.equal(v.data.float32.length, DIM);
    }
  }
  assert.equal(seen.size, rowsCos.length);
  const def = await send(c, 'ListVectorsCommand', { vectorBucketName: B, indexName: 'cos-idx' });
  assert.equal(def.vectors.length, 500);
  assert.ok(def.nextToken);
});

const FILTERS = [
  { genre: 'drama' },
  { genre: { $ne: 'drama' } },
  { year: { $gte: 2010 } },
  { $and: [{ genre: { $eq: 'drama' } }, { year: { $gte: 2005 } }] },
  { $or: [{ genre: 'horror' }, { rating: { $lt: 1.5 } }] },
  { genre: { $in: ['comedy', 'documentary'] } },
  { genre: { $nin: ['comedy', 'documentary'] }, year: { $lt: 2000 } },
  { rating: { $exists: false } },
  { flag: true },
  { tags: 't3' },
  { tags: { $in: ['t0', 't4'] }, rating: { $gt: 2, $lte: 4 } },
  { $or: [{ $and: [{ genre: 'comedy' }, { tags: { $ne: 't1' } }] }, { year: 1990 }] },
  { genre: 'no-such-genre' },
];

test('QueryVectors equals brute force (cosine and euclidean, batched and filtered)', async () => {
  const r = rng(99);
  for (const [index, rows, metric, dim] of [['cos-idx', rowsCos, 'cosine', DIM],
    ['l2.idx', rowsL2, 'euclidean', 8]]) {
    // Concurrent queries: the gateway batches queued queries of one index into one scan.
    const qs = Array.from({ length: 12 }, () => Array.from({ length: dim },
      () => Math.fround(r() * 2 - 1)));
    // On a cluster, half of the queries enter through the other compute node.
    const res = await Promise.all(qs.map((q, i) => send(i % 2 && srv.cluster ? c1 : c,
      'QueryVectorsCommand', {
      vectorBucketName: B, indexName: index, topK: 10, queryVector: { float32: q },
      returnDistance: true })));
    res.forEach((out, i) => {
      assert.equal(out.distanceMetric, metric);
      assertSameAsBruteForce(out.vectors, rows, metric, qs[i], 10);
      assert.equal(out.vectors[0].metadata, undefined);
    });
    for (const filter of FILTERS) {
      const q = qs[0];
      const out = await send(c, 'QueryVectorsCommand', { indexArn:
        `arn:aws:s3vectors:us-east-1:000000000000:bucket/${B}/index/${index}`, topK: 25,
      queryVector: { float32: q }, filter, returnDistance: true, returnMetadata: true });
      assertSameAsBruteForce(out.vectors, rows, metric, q, 25, filter);
      for (const v of out.vectors) {
        assert.deepEqual(v.metadata, rows.find((x) => x.key === v.key).metadata);
      }
    }
  }
  const noDist = await send(c, 'QueryVectorsCommand', { vectorBucketName: B,
    indexName: 'l2.idx', topK: 1, queryVector: { float32: rowsL2[3].data.float32 } });
  assert.deepEqual(noDist.vectors, [{ key: 'e3' }]);
});

test('overwrite and DeleteVectors are visible to Get, List and Query', async () => {
  const dead = rowsCos.slice(0, 40).map((v) => v.key);
  await send(c, 'DeleteVectorsCommand', { vectorBucketName: B, indexName: 'cos-idx',
    keys: [...dead, 'never-existed'] });
  const changed = rowsCos.slice(40, 60).map((v) => ({ key: v.key,
    data: { float32: v.data.float32.map((x) => Math.fround(-x)) },
    metadata: { genre: 'changed', year: 2030 } }));
  await send(c, 'PutVectorsCommand', { vectorBucketName: B, indexName: 'cos-idx',
    vectors: changed });
  const live = [...changed, ...rowsCos.slice(60)];
  const g = await send(c, 'GetVectorsCommand', { vectorBucketName: B, indexName: 'cos-idx',
    keys: ['c0', 'c39', 'c40'], returnMetadata: true });
  assert.deepEqual(g.vectors, [{ key: 'c40', metadata: { genre: 'changed', year: 2030 } }]);
  const { vectors } = await listAll(c, { vectorBucketName: B, indexName: 'cos-idx',
    maxResults: 1000 });
  assert.equal(vectors.length, live.length);
  const q = changed[0].data.float32;
  const out = await send(c, 'QueryVectorsCommand', { vectorBucketName: B, indexName: 'cos-idx',
    topK: 30, queryVector: { float32: q }, returnDistance: true });
  assertSameAsBruteForce(out.vectors, live, 'cosine', q, 30);
  assert.equal(out.vectors[0].key, 'c40');
  const f = await send(c, 'QueryVectorsCommand', { vectorBucketName: B, indexName: 'cos-idx',
    topK: 100, queryVector: { float32: q }, filter: { genre: 'changed' }, returnDistance: true });
  assertSameAsBruteForce(f.vectors, live, 'cosine', q, 100, { genre: 'changed' });
  assert.equal(f.vectors.length, 20);
});

test('error shapes: ValidationException with fieldList, NotFound, Conflict, AccessDenied',
  async () => {
    const base = { vectorBucketName: B, indexName: 'cos-idx' };
    const q = rowsCos[100].data.float32;
    let e = await expectError(send(c, 'QueryVectorsCommand', { ...base, topK: 101,
      queryVector: { float32: q } }), 'ValidationException', 400);
    assert.equal(e.fieldList[0].path, '/topK');
    e = await expectError(send(c, 'QueryVectorsCommand', { ...base, topK: 1,
      queryVector: { float32: [1, 2] } }), 'ValidationException', 400);
    assert.equal(e.fieldList[0].path, '/queryVector/float32');
    e = await expectError(send(c, 'QueryVectorsCommand', { ...base, topK: 1,
      queryVector: { float32: q }, filter: { text: 'free text 1' } }), 'ValidationException', 400);
    assert.match(e.message, /non-filterable/);
    e = await expectError(send(c, 'QueryVectorsCommand', { ...base, topK: 1,
      queryVector: { float32: q }, filter: { year: { $gt: 'x' } } }), 'ValidationException', 400);
    assert.equal(e.fieldList[0].path, '/filter');
    e = await expectError(send(c, 'PutVectorsCommand', { ...base, vectors: [{ key: 'z',
      data: { float32: new Array(DIM).fill(0) } }] }), 'ValidationException', 400);
    assert.match(e.message, /zero/);
    e = await expectError(send(c, 'PutVectorsCommand', { ...base, vectors: [{ key: 'z',
      data: { float32: q }, metadata: Object.fromEntries(Array.from({ length: 51 },
        (_, i) => [`k${i}`, i])) }] }), 'ValidationException', 400);
    assert.equal(e.fieldList[0].path, '/vectors/0/metadata');
    e = await expectError(send(c, 'PutVectorsCommand', { ...base,
      vectors: Array.from({ length: 501 }, (_, i) => ({ key: `k${i}`, data: { float32: q } })) }),
    'ValidationException', 400);
    e = await expectError(send(c, 'GetVectorsCommand', { ...base,
      keys: Array.from({ length: 101 }, (_, i) => `k${i}`) }), 'ValidationException', 400);
    e = await expectError(send(c, 'CreateIndexCommand', { vectorBucketName: B,
      indexName: 'big', dataType: 'float32', dimension: 4097, distanceMetric: 'cosine' }),
    'ValidationException', 400);
    assert.equal(e.fieldList[0].path, '/dimension');
    e = await expectError(send(c, 'ListVectorsCommand', { ...base, nextToken: 'bogus' }),
      'ValidationException', 400);
    await expectError(send(c, 'QueryVectorsCommand', { vectorBucketName: B, indexName: 'nope',
      topK: 1, queryVector: { float32: q } }), 'NotFoundException', 404);
    await expectError(send(c, 'GetVectorsCommand', { vectorBucketName: 'no-bucket',
      indexName: 'nope', keys: ['a'] }), 'NotFoundException', 404);
    await expectError(send(c, 'CreateVectorBucketCommand', { vectorBucketName: B }),
      'ConflictException', 409);
    await expectError(send(client(srv, { sk: 'wrong' }), 'ListVectorBucketsCommand', {}),
      'InvalidSignatureException', 403);
    await expectError(send(client(srv, { ak: 'AKIDUNKNOWN' }), 'ListVectorBucketsCommand',
      {}), 'UnrecognizedClientException', 403);
    e = await expectError(send(client(srv, { clockOffset: 3600e3 }),
      'ListVectorBucketsCommand', {}), 'AccessDeniedException', 403);
    assert.match(e.message, /expired/);
    if (srv.cluster) {
      // The compute nodes' internal path takes only the key derived from the cluster
      // secret, not an S3 user's key.
      await expectError(send(client(srv, { prefix: '/_dmann' }), 'QueryVectorsCommand',
        { vectorBucketName: B, indexName: 'cos-idx', topK: 1, queryVector: { float32: q } }),
      'UnrecognizedClientException', 403);
    }
  });

test('tags: at create, Tag/Untag/ListTagsForResource on buckets and indexes', async () => {
  const TB = 'tagged-b';
  const barn = (await send(c, 'CreateVectorBucketCommand', { vectorBucketName: TB,
    tags: { team: 'search', env: 'test' } })).vectorBucketArn;
  const xarn = (await send(c, 'CreateIndexCommand', { vectorBucketName: TB, indexName: 'tix',
    dataType: 'float32', dimension: 4, distanceMetric: 'euclidean',
    tags: { owner: 'alice' } })).indexArn;
  assert.deepEqual((await send(c1, 'ListTagsForResourceCommand', { resourceArn: barn })).tags,
    { team: 'search', env: 'test' });
  assert.deepEqual((await send(c, 'ListTagsForResourceCommand', { resourceArn: xarn })).tags,
    { owner: 'alice' });
  await send(c, 'TagResourceCommand', { resourceArn: barn, tags: { env: 'prod', 'a b:c': '' } });
  assert.deepEqual((await send(c1, 'ListTagsForResourceCommand', { resourceArn: barn })).tags,
    { team: 'search', env: 'prod', 'a b:c': '' });
  await send(c, 'UntagResourceCommand', { resourceArn: barn, tagKeys: ['team', 'a b:c', 'zz'] });
  assert.deepEqual((await send(c, 'ListTagsForResourceCommand', { resourceArn: barn })).tags,
    { env: 'prod' });
  await send(c, 'UntagResourceCommand', { resourceArn: xarn, tagKeys: ['owner'] });
  assert.deepEqual((await send(c, 'ListTagsForResourceCommand', { resourceArn: xarn })).tags, {});
  let e = await expectError(send(c, 'TagResourceCommand', { resourceArn: barn,
    tags: { 'aws:x': 'y' } }), 'ValidationException', 400);
  assert.equal(e.fieldList[0].path, '/tags');
  await expectError(send(c, 'TagResourceCommand', { resourceArn: barn,
    tags: Object.fromEntries(Array.from({ length: 50 }, (_, i) => [`k${i}`, 'v'])) }),
  'ValidationException', 400);
  e = await expectError(send(c, 'CreateVectorBucketCommand', { vectorBucketName: 'tag-bad',
    tags: { k: 'v'.repeat(257) } }), 'ValidationException', 400);
  await expectError(send(c, 'GetVectorBucketCommand', { vectorBucketName: 'tag-bad' }),
    'NotFoundException', 404);
  await expectError(send(c, 'ListTagsForResourceCommand', {
    resourceArn: barn.replace(TB, 'no-such-b') }), 'NotFoundException', 404);
  e = await expectError(send(c, 'ListTagsForResourceCommand', { resourceArn: 'arn:aws:s3:::x' }),
    'ValidationException', 400);
  assert.equal(e.fieldList[0].path, '/resourceArn');
  // Tags go with their resource: a bucket created again under the name has none.
  await send(c, 'DeleteIndexCommand', { indexArn: xarn });
  await send(c, 'DeleteVectorBucketCommand', { vectorBucketName: TB });
  await send(c, 'CreateVectorBucketCommand', { vectorBucketName: TB });
  assert.deepEqual((await send(c, 'ListTagsForResourceCommand', { resourceArn: barn })).tags, {});
  await send(c, 'DeleteVectorBucketCommand', { vectorBucketName: TB });
});

test('bucket policies: two identities, Deny wins, NotAction, Put/Get/Delete policy',
  async () => {
    const PB = 'policy-b';
    const alice = client(srv, { id: 'alice' });
    const bob = client(srv, { id: 'bob', cn: srv.cluster ? 1 : 0 });
    const bobArn = 'arn:aws:iam::000000000000:user/bob';
    const aliceArn = 'arn:aws:iam::000000000000:user/alice';
    const barn = (await send(alice, 'CreateVectorBucketCommand', { vectorBucketName: PB }))
      .vectorBucketArn;
    await send(alice, 'CreateIndexCommand', { vectorBucketName: PB, indexName: 'pix',
      dataType: 'float32', dimension: 4, distanceMetric: 'euclidean' });
    const put = (who, key) => send(who, 'PutVectorsCommand', { vectorBucketName: PB,
      indexName: 'pix', vectors: [{ key, data: { float32: [1, 2, 3, 4] } }] });
    await expectError(send(alice, 'GetVectorBucketPolicyCommand', { vectorBucketName: PB }),
      'NotFoundException', 404);
    // 1. bob may not PutVectors into any index of the bucket; alice may.
    const denyPut = JSON.stringify({ Version: '2012-10-17', Statement: [{ Sid: 'nobobput',
      Effect: 'Deny', Principal: { AWS: [bobArn] }, Action: 's3vectors:Put*',
      Resource: `${barn}/index/*` }, { Effect: 'Allow', Principal: '*', Action: 's3vectors:*',
      Resource: [barn, `${barn}/*`] }] });
    await send(alice, 'PutVectorBucketPolicyCommand', { vectorBucketName: PB, policy: denyPut });
    assert.equal((await send(bob, 'GetVectorBucketPolicyCommand', { vectorBucketArn: barn }))
      .policy, denyPut);
    let e = await expectError(put(bob, 'b1'), 'AccessDeniedException', 403);
    assert.match(e.message, /explicit deny/);
    await put(alice, 'a1');
    const got = await send(bob, 'GetVectorsCommand', { vectorBucketName: PB, indexName: 'pix',
      keys: ['a1', 'b1'] });
    assert.deepEqual(got.vectors.map((v) => v.key), ['a1']);
    // 2. bob may only GetVectors (Deny with NotAction); alice is not concerned.
    const onlyGet = JSON.stringify({ Statement: { Effect: 'Deny', Principal: { AWS: bobArn },
      NotAction: ['s3vectors:GetVectors', 's3vectors:GetVectorBucketPolicy'], Resource: '*' } });
    await send(alice, 'PutVectorBucketPolicyCommand', { vectorBucketName: PB, policy: onlyGet });
    assert.equal((await send(bob, 'GetVectorsCommand', { vectorBucketName: PB, indexName: 'pix',
      keys: ['a1'] })).vectors.length, 1);
    await expectError(send(bob, 'QueryVectorsCommand', { vectorBucketName: PB, indexName: 'pix',
      topK: 1, queryVector: { float32: [1, 2, 3, 4] } }), 'AccessDeniedException', 403);
    await expectError(send(bob, 'ListVectorsCommand', { vectorBucketName: PB, indexName: 'pix' }),
      'AccessDeniedException', 403);
    await expectError(send(bob, 'ListTagsForResourceCommand', { resourceArn: barn }),
      'AccessDeniedException', 403);
    await expectError(send(bob, 'DeleteVectorBucketPolicyCommand', { vectorBucketName: PB }),
      'AccessDeniedException', 403);
    await expectError(put(bob, 'b2'), 'AccessDeniedException', 403);
    assert.equal((await send(alice, 'QueryVectorsCommand', { vectorBucketName: PB,
      indexName: 'pix', topK: 1, queryVector: { float32: [1, 2, 3, 4] } })).vectors.length, 1);
    // The default identity and alice are unaffected; the bucket list is account-level.
    await send(c, 'ListVectorsCommand', { vectorBucketName: PB, indexName: 'pix' });
    await send(bob, 'ListVectorBucketsCommand', {});
    // 3. Malformed policies are refused, the current one is kept.
    for (const bad of ['{', '{"Statement":[]}', JSON.stringify({ Statement: { Effect: 'Maybe',
      Principal: '*', Action: '*', Resource: '*' } }), JSON.stringify({ Statement: {
      Effect: 'Deny', Principal: '*', Action: 's3:GetObject', Resource: '*' } }),
    JSON.stringify({ Statement: { Effect: 'Deny', Principal: '*', Action: '*', Resource: '*',
      Condition: {} } })]) {
      e = await expectError(send(alice, 'PutVectorBucketPolicyCommand', { vectorBucketName: PB,
        policy: bad }), 'ValidationException', 400);
      assert.equal(e.fieldList[0].path, '/policy');
      assert.match(e.message, /MalformedPolicy/);
    }
    assert.equal((await send(alice, 'GetVectorBucketPolicyCommand', { vectorBucketName: PB }))
      .policy, onlyGet);
    // 4. A Deny of everything for alice's own principal: explicit deny wins over the Allow.
    const denyAlice = JSON.stringify({ Statement: [{ Effect: 'Allow', Principal: '*',
      Action: '*', Resource: '*' }, { Effect: 'Deny', Principal: { AWS: aliceArn },
      Action: 's3vectors:Get?ectors', Resource: `${barn}/index/pi?` }] });
    await send(c, 'PutVectorBucketPolicyCommand', { vectorBucketName: PB, policy: denyAlice });
    await expectError(send(alice, 'GetVectorsCommand', { vectorBucketName: PB, indexName: 'pix',
      keys: ['a1'] }), 'AccessDeniedException', 403);
    await put(bob, 'b3');
    await send(c, 'DeleteVectorBucketPolicyCommand', { vectorBucketName: PB });
    await expectError(send(alice, 'GetVectorBucketPolicyCommand', { vectorBucketName: PB }),
      'NotFoundException', 404);
    await put(bob, 'b4');
    assert.equal((await send(alice, 'GetVectorsCommand', { vectorBucketName: PB,
      indexName: 'pix', keys: ['a1', 'b3', 'b4'] })).vectors.length, 3);
    await send(alice, 'DeleteIndexCommand', { vectorBucketName: PB, indexName: 'pix' });
    await send(alice, 'DeleteVectorBucketCommand', { vectorBucketName: PB });
  });

test('QueryVectors nextToken: one page, no token issued; a token is refused', async () => {
  const q = { vectorBucketName: B, indexName: 'cos-idx', topK: 3,
    queryVector: { float32: rowsCos[1].data.float32 } };
  const out = await send(c, 'QueryVectorsCommand', q);
  assert.equal(out.nextToken, undefined);
  const e = await expectError(send(c, 'QueryVectorsCommand', { ...q, nextToken: 'abc' }),
    'ValidationException', 400);
  assert.equal(e.fieldList[0].path, '/nextToken');
});

test('policy_default = deny: a bucket with a policy admits only what it allows', async () => {
  const dir = fs.mkdtempSync(path.join(tmp, 'pdeny-'));
  const s2 = await startServer(dir, ['--policy-default', 'deny',
    '--up', JSON.stringify(['--s3-set', 'policy_default=deny'])]);
  try {
    const alice = client(s2, { id: 'alice' });
    const bob = client(s2, { id: 'bob' });
    const barn = (await send(alice, 'CreateVectorBucketCommand', { vectorBucketName: 'pd-b' }))
      .vectorBucketArn;
    await send(alice, 'CreateIndexCommand', { vectorBucketName: 'pd-b', indexName: 'pdx',
      dataType: 'float32', dimension: 2, distanceMetric: 'euclidean' });
    const put = (who) => send(who, 'PutVectorsCommand', { vectorBucketName: 'pd-b',
      indexName: 'pdx', vectors: [{ key: 'k', data: { float32: [1, 2] } }] });
    await put(bob);                                // no policy: open to every identity
    await send(alice, 'PutVectorBucketPolicyCommand', { vectorBucketName: 'pd-b',
      policy: JSON.stringify({ Statement: [{ Effect: 'Allow',
        Principal: { AWS: 'arn:aws:iam::000000000000:user/alice' }, Action: 's3vectors:*',
        Resource: [barn, `${barn}/index/*`] }, { Effect: 'Allow', Principal: '*',
        Action: 's3vectors:GetVectors', Resource: `${barn}/index/*` }] }) });
    await put(alice);
    const e = await expectError(put(bob), 'AccessDeniedException', 403);
    assert.match(e.message, /no resource-based policy allows/);
    assert.equal((await send(bob, 'GetVectorsCommand', { vectorBucketName: 'pd-b',
      indexName: 'pdx', keys: ['k'] })).vectors.length, 1);
    await expectError(send(bob, 'GetIndexCommand', { vectorBucketName: 'pd-b',
      indexName: 'pdx' }), 'AccessDeniedException', 403);
    await send(alice, 'DeleteVectorBucketPolicyCommand', { vectorBucketName: 'pd-b' });
    await put(bob);
  } finally {
    await stopServer(s2);
  }
});

test('overload: more concurrent queries than the queue admits get 503 at once', async () => {
  const dir = fs.mkdtempSync(path.join(tmp, 'ovl-'));
  // On a cluster: W = 1 here (one member per query; R from the query rate).
  const s2 = await startServer(dir, CLUSTER ? ['--queue-depth', '2', '--search-threads', '1',
    '--width', '1'] : ['--queue-depth', '2', '--search-threads', '1', '--batch', '1']);
  const c2 = client(s2);
  await send(c2, 'CreateVectorBucketCommand', { vectorBucketName: 'ovl' });
  await send(c2, 'CreateIndexCommand', { vectorBucketName: 'ovl', indexName: 'big',
    dataType: 'float32', dimension: 512, distanceMetric: 'euclidean' });
  const big = makeVectors(6000, 512, 5, 'b').map((v) => ({ key: v.key, data: v.data }));
  await putAll(c2, 'ovl', 'big', big);
  const t0 = Date.now();
  const results = await Promise.allSettled(Array.from({ length: 40 }, (_, i) =>
    send(c2, 'QueryVectorsCommand', { vectorBucketName: 'ovl', indexName: 'big', topK: 5,
      queryVector: { float32: big[i].data.float32 } }).then((r) => ({ r, t: Date.now() - t0 }))
      .catch((e) => { e.t = Date.now() - t0; throw e; })));
  const ok = results.filter((x) => x.status === 'fulfilled');
  const refused = results.filter((x) => x.status === 'rejected');
  assert.ok(ok.length >= 1, 'some queries are served');
  assert.ok(refused.length >= 1, 'some queries are refused');
  for (const x of refused) {
    assert.equal(x.reason.name, 'ServiceUnavailableException');
    assert.equal(x.reason.$metadata.httpStatusCode, 503);
  }
  for (const x of ok) assert.equal(x.value.r.vectors[0].key, big[results.indexOf(x)].key);
  const slowestOk = Math.max(...ok.map((x) => x.value.t));
  const slowestRefusal = Math.max(...refused.map((x) => x.reason.t));
  console.log(`# overload: ${ok.length} served, ${refused.length} refused with 503; ` +
    `slowest refusal ${slowestRefusal} ms, slowest answer ${slowestOk} ms`);
  await stopServer(s2);
});

test('kill -9 after acknowledged PutVectors: every acknowledged vector survives', async () => {
  const dir = fs.mkdtempSync(path.join(tmp, 'crash-'));
  let s3 = await startServer(dir);
  let c3 = client(s3);
  await send(c3, 'CreateVectorBucketCommand', { vectorBucketName: 'crash' });
  await send(c3, 'CreateIndexCommand', { vectorBucketName: 'crash', indexName: 'crash-ix',
    dataType: 'float32', dimension: 16, distanceMetric: 'cosine' });
  const rows = makeVectors(900, 16, 3, 'k');
  // A stream of puts; kill -9 while more are in flight; only acknowledged ones count.
  const acked = [];
  let killed = false;
  const stream = (async () => {
    for (let i = 0; i < rows.length && !killed; i += 50) {
      const batch = rows.slice(i, i + 50);
      try {
        await send(c3, 'PutVectorsCommand', { vectorBucketName: 'crash', indexName: 'crash-ix',
          vectors: batch });
        acked.push(...batch);
      } catch (e) {
        break;
      }
    }
  })();
  while (acked.length < 300) await new Promise((res) => setTimeout(res, 5));
  killed = true;
  if (s3.cluster) {
    // The memory node holding the bucket (redundancy 1: only its WAL has the writes) dies
    // while the compute nodes keep running; then it is started again.
    const id = [0, 1].find((i) => fs.statSync(path.join(s3.cdir, `mn${i}`, 'flat', 'wal'),
      { throwIfNoEntry: false })?.size > 0);
    assert.notEqual(id, undefined, 'no memory node holds the bucket');
    const pid = pidsOf(s3).get(`mn${id}`);
    process.kill(pid, 'SIGKILL');
    await waitDead(pid);
    await stream;
    restartMn(s3, id);
    await waitReady(c3, 'crash');
  } else {
    s3.proc.kill('SIGKILL');
    await s3.exited;
    servers.splice(servers.indexOf(s3), 1);
    await stream;
    s3 = await startServer(dir);
    c3 = client(s3);
  }
  for (let i = 0; i < acked.length; i += 100) {
    const keys = acked.slice(i, i + 100).map((v) => v.key);
    const r = await send(c3, 'GetVectorsCommand', { vectorBucketName: 'crash', indexName: 'crash-ix',
      keys, returnData: true, returnMetadata: true });
    assert.equal(r.vectors.length, keys.length, 'acknowledged vectors missing after kill -9');
    for (const v of r.vectors) {
      const want = rows[Number(v.key.slice(1))];
      assert.deepEqual(v.metadata, want.metadata);
      assert.deepEqual(v.data.float32.map(Math.fround), want.data.float32);
    }
  }
  console.log(`# kill -9: ${acked.length} acknowledged vectors all recovered`);
  await stopServer(s3);
});

test('clean restart keeps everything; delete index and bucket', async () => {
  if (srv.cluster) {
    // Restart both memory nodes (SIGTERM: snapshot), compute nodes stay up.
    const pids = pidsOf(srv);
    for (const id of [0, 1]) {
      process.kill(pids.get(`mn${id}`), 'SIGTERM');
      await waitDead(pids.get(`mn${id}`));
      restartMn(srv, id);
    }
    await waitReady(c, B);
  } else {
    await stopServer(srv);
    srv = await startServer(tmp);
    c = client(srv);
  }
  const { vectors } = await listAll(c, { vectorBucketName: B, indexName: 'l2.idx',
    maxResults: 1000 });
  assert.equal(vectors.length, rowsL2.length);
  await send(c, 'DeleteIndexCommand', { vectorBucketName: B, indexName: 'l2.idx' });
  await send(c, 'DeleteIndexCommand', { indexArn:
    `arn:aws:s3vectors:us-east-1:000000000000:bucket/${B}/index/cos-idx` });
  await send(c, 'DeleteVectorBucketCommand', { vectorBucketName: B });
  const all = await send(c, 'ListVectorBucketsCommand', {});
  assert.deepEqual(all.vectorBuckets.map((b) => b.vectorBucketName), ['alpha-2', 'beta-1']);
});

// The fan-out cases and the index at the limits run in the HTTP cluster run of the suite;
// the HTTPS run (the same SDK calls over TLS) skips them, each with its reason: the
// sub-requests between gateways are plain HTTP whatever the client uses, and the 80 MB of
// the wide index's puts add nothing about TLS that the other cases do not show.
const NO_TLS_CASE = !CLUSTER ? 'no fan-out in one process' :
  HTTPS ? 'covered by the HTTP cluster run (nothing TLS-specific)' : false;
test('fan-out: a slow member is hedged, a dead one retried elsewhere', { skip: NO_TLS_CASE },
  async () => {
    // cn1 delays every scan it serves for another CN by 3 s; cn0 hedges after 50 ms.
    const dir = fs.mkdtempSync(path.join(tmp, 'fan-'));
    const s4 = await startServer(dir, ['--frag-rows', '128', '--env', JSON.stringify({
      DMANN_S3_TEST_DELAY_CN: '1', DMANN_S3_TEST_DELAY_MS: '3000', DMANN_S3_HEDGE_MS: '50' })]);
    const c4 = client(s4);
    await send(c4, 'CreateVectorBucketCommand', { vectorBucketName: 'fan' });
    await send(c4, 'CreateIndexCommand', { vectorBucketName: 'fan', indexName: 'fan-ix',
      dataType: 'float32', dimension: 8, distanceMetric: 'euclidean' });
    const rows = makeVectors(1500, 8, 21, 'f');
    await putAll(c4, 'fan', 'fan-ix', rows);
    const q = rows[7].data.float32;
    const ask = async () => {
      const t0 = Date.now();
      const out = await send(c4, 'QueryVectorsCommand', { vectorBucketName: 'fan',
        indexName: 'fan-ix', topK: 20, queryVector: { float32: q }, returnDistance: true,
        filter: { genre: { $ne: 'horror' } } });
      assertSameAsBruteForce(out.vectors, rows, 'euclidean', q, 20, { genre: { $ne: 'horror' } });
      return Date.now() - t0;
    };
    const hedged = await ask();
    assert.ok(hedged < 2500, `hedged query took ${hedged} ms (member delay 3000 ms)`);
    const pid = pidsOf(s4).get('cn1');
    process.kill(pid, 'SIGKILL');
    await waitDead(pid);
    const retried = await ask();
    console.log(`# fan-out: hedged query ${hedged} ms, with a dead member ${retried} ms`);
    await stopServer(s4);
    // cn0 counted what it did at its clean stop.
    const m = fs.readFileSync(path.join(s4.cdir, 'cn0.log'), 'utf8')
      .match(/s3: (\d+) sub-requests \(\d+ connections opened, \d+ kept-alive ones reused\), (\d+) hedged, (\d+) retried/);
    assert.ok(m, 'cn0 reported no S3 counters');
    assert.ok(Number(m[1]) >= 1, 'cn0 sent no sub-request to cn1 (no fan-out)');
    assert.ok(Number(m[2]) >= 1, 'the slow member was not hedged');
    assert.ok(Number(m[3]) >= 1, 'the dead member was not retried elsewhere');
  });

// Sub-requests to members go over kept-alive connections ([s3] member_conns, default 8):
// 40 fanned-out queries open a handful of connections and reuse them, with the same answers
// as with member_conns = 0 (one connection per sub-request, the member closing it).
test('fan-out: sub-requests reuse kept-alive connections to members', { skip: NO_TLS_CASE },
  async () => {
    const rows = makeVectors(1500, 8, 22, 'k');
    const run = async (env) => {
      const dir = fs.mkdtempSync(path.join(tmp, 'keep-'));
      const sk = await startServer(dir, ['--frag-rows', '128', '--env', JSON.stringify(env)]);
      const ck = client(sk);
      await send(ck, 'CreateVectorBucketCommand', { vectorBucketName: 'keep' });
      await send(ck, 'CreateIndexCommand', { vectorBucketName: 'keep', indexName: 'keep-ix',
        dataType: 'float32', dimension: 8, distanceMetric: 'euclidean' });
      await putAll(ck, 'keep', 'keep-ix', rows);
      for (let i = 0; i < 40; i++) {
        const q = rows[(i * 37) % rows.length].data.float32;
        const out = await send(ck, 'QueryVectorsCommand', { vectorBucketName: 'keep',
          indexName: 'keep-ix', topK: 10, queryVector: { float32: q }, returnDistance: true });
        assertSameAsBruteForce(out.vectors, rows, 'euclidean', q, 10);
      }
      await stopServer(sk);
      const m = fs.readFileSync(path.join(sk.cdir, 'cn0.log'), 'utf8')
        .match(/s3: (\d+) sub-requests \((\d+) connections opened, (\d+) kept-alive ones reused\)/);
      assert.ok(m, 'cn0 reported no S3 counters');
      return { subreqs: Number(m[1]), conns: Number(m[2]), reused: Number(m[3]) };
    };
    const keep = await run({ DMANN_S3_WIDTH: '2' });
    const close = await run({ DMANN_S3_WIDTH: '2', DMANN_S3_MEMBER_CONNS: '0' });
    console.log(`# fan-out connections: kept alive ${JSON.stringify(keep)}, ` +
      `member_conns 0 ${JSON.stringify(close)}`);
    assert.ok(keep.subreqs >= 40, `cn0 fanned out ${keep.subreqs} sub-requests for 40 queries`);
    assert.ok(keep.reused >= keep.subreqs - 8, `kept-alive connections reused ${keep.reused} ` +
      `times for ${keep.subreqs} sub-requests`);
    assert.ok(keep.conns <= 8, `${keep.conns} connections opened (member_conns 8)`);
    assert.ok(close.subreqs >= 40 && close.reused === 0 && close.conns >= close.subreqs,
      `member_conns 0: ${JSON.stringify(close)}`);
  });

// Regression: an index at the API's limits (dimension 4096, 40 KB of metadata per vector,
// a few thousand vectors) answers QueryVectors on the cluster path. Its one fragment holds
// ~115 MB of rows, past the 64 MiB FL stream cap: the memory node used to drop the
// connection on the fragment fetch and every query got 503. Fragments are now fetched in
// bounded pieces ([s3] frag_fetch_kb, at most 32 MiB per answer on the MN).
test('an index at the limits (dim 4096, 40 KB metadata, 2000 vectors) answers queries',
  { skip: NO_TLS_CASE }, async () => {
    const dir = fs.mkdtempSync(path.join(tmp, 'wide-'));
    const s5 = await startServer(dir);
    const c5 = client(s5);
    const DIM = 4096;
    const N = 2000;
    await send(c5, 'CreateVectorBucketCommand', { vectorBucketName: 'wide' });
    await send(c5, 'CreateIndexCommand', { vectorBucketName: 'wide', indexName: 'wide-ix',
      dataType: 'float32', dimension: DIM, distanceMetric: 'cosine',
      metadataConfiguration: { nonFilterableMetadataKeys: ['text'] } });
    const rows = makeVectors(N, DIM, 33, 'w');
    for (const [i, r] of rows.entries()) {
      const md = { genre: r.metadata.genre, year: r.metadata.year, text: '' };
      // The whole metadata at exactly 40 KB of compact JSON.
      md.text = `${i}:`.padEnd(40 * 1024 - JSON.stringify(md).length, 'x');
      assert.equal(JSON.stringify(md).length, 40 * 1024);
      r.metadata = md;
    }
    await putAll(c5, 'wide', 'wide-ix', rows, 100);
    for (const [qi, filter] of [[3, undefined], [1500, { genre: { $eq: 'drama' } }]]) {
      const q = rows[qi].data.float32;
      const out = await send(c5, 'QueryVectorsCommand', { vectorBucketName: 'wide',
        indexName: 'wide-ix', topK: 5, queryVector: { float32: q }, returnDistance: true,
        returnMetadata: true, ...(filter ? { filter } : {}) });
      assertSameAsBruteForce(out.vectors, rows, 'cosine', q, 5, filter);
      if (!filter) assert.equal(out.vectors[0].key, rows[qi].key);
      for (const v of out.vectors) {
        assert.deepEqual(v.metadata, rows[Number(v.key.slice(1))].metadata);
      }
    }
    // A delete after the fragment is cached: the tombstones are refreshed, not the rows.
    await send(c5, 'DeleteVectorsCommand', { vectorBucketName: 'wide', indexName: 'wide-ix',
      keys: [rows[3].key] });
    const left = rows.filter((r) => r.key !== rows[3].key);
    const q3 = rows[3].data.float32;
    const again = await send(c5, 'QueryVectorsCommand', { vectorBucketName: 'wide',
      indexName: 'wide-ix', topK: 5, queryVector: { float32: q3 }, returnDistance: true });
    assertSameAsBruteForce(again.vectors, left, 'cosine', q3, 5);
    // The gateway's counters in the CN's Prometheus metrics; the cache at its default size.
    const ini = fs.readFileSync(s5.ini, 'utf8');
    const mport = ini.match(/\[cn\.0\]\naddress = [^\n]*\nmetrics = 127\.0\.0\.1:(\d+)/)[1];
    const metrics = async () => {
      const text = await (await fetch(`http://127.0.0.1:${mport}/metrics`)).text();
      return (name) => Number(text.match(new RegExp(`^${name}\\{node="0"\\} (\\d+)`, 'm'))?.[1]);
    };
    let metric = await metrics();
    assert.equal(metric('dmann_cn_s3_fragment_cache_capacity_bytes'), 2048 * 1024 * 1024);
    assert.equal(metric('dmann_cn_s3_plan_fallbacks_total'), 0);
    assert.ok(metric('dmann_cn_s3_fragment_cache_misses_total') >= 1);
    // Settings come from the cluster file: cn0 restarted with [s3] cache_mb = 512.
    const pid0 = pidsOf(s5).get('cn0');
    process.kill(pid0, 'SIGTERM');
    await waitDead(pid0);
    fs.writeFileSync(s5.ini, ini.replace(/^\[s3\]\n/m, '[s3]\ncache_mb = 512\n'));
    const log = fs.openSync(path.join(s5.cdir, 'cn0.restart.log'), 'a');
    const p0 = spawn(path.join(BINDIR, 'dmann-cn'), ['--config', s5.ini, '--id', '0'],
      { env: clusterEnv(s5.extra), stdio: ['ignore', log, log], detached: true });
    fs.closeSync(log);
    p0.unref();
    s5.restarted.push(['cn0', p0]);
    for (let i = 0; ; i++) {          // until cn0 serves its gateway and its metrics again
      try {
        await send(c5, 'GetVectorBucketCommand', { vectorBucketName: 'wide' });
        metric = await metrics();
        break;
      } catch (e) {
        if (i > 400) throw e;
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    assert.equal(metric('dmann_cn_s3_fragment_cache_capacity_bytes'), 512 * 1024 * 1024);
    const after = await send(c5, 'QueryVectorsCommand', { vectorBucketName: 'wide',
      indexName: 'wide-ix', topK: 5, queryVector: { float32: q3 }, returnDistance: true });
    assertSameAsBruteForce(after.vectors, left, 'cosine', q3, 5);
    // The fragment came in several pieces (16 MiB each by default).
    await stopServer(s5);
    const fetches = [0, 1].map((id) => {
      const m = fs.readFileSync(path.join(s5.cdir, `cn${id}.log`), 'utf8')
        .match(/(\d+) fragment fetches/);
      return m ? Number(m[1]) : 0;
    });
    console.log(`# wide index: ${N} x dim ${DIM} + 40 KB metadata; fragment pieces fetched ` +
      `by cn0, cn1: ${fetches.join(', ')}`);
    assert.ok(fetches[0] + fetches[1] >= 5, 'the fragment was not fetched in pieces');
  });

test('stop the cluster cleanly', { skip: !CLUSTER }, async () => {
  await stopServer(srv);
});
