// chaos_sdk.js: the AWS SDK half of issue 14's chaos test (tests/test_chaos.c starts it and
// checks what it reports). Not a node:test file: a driver that runs until told to stop.
//
// Against the two gateways of a local cluster (cn0 and cn1, from CHAOS_DIR/cluster.ini),
// while test_chaos.c kills memory nodes and once compute node cn1:
//   - a writer puts batches of 10 vectors (keys s00000000.., 32 dims, about 10 rows a
//     second) into CHAOS_INDEX (an index of the C test's bucket), alternating between the
//     gateways;
//   - two readers send QueryVectors (top 10) with an acknowledged vector, alternating too.
// Every attempt is timed. An operation whose attempt fails is sent again to the other
// gateway (a client that knows two endpoints), up to 4 times in all with a pause of 1 s
// after the second; the SDK itself retries 503 (maxAttempts 3). When CHAOS_DIR/sdk.stop
// exists the loops end; then, with the kill window of cn1 read from CHAOS_DIR/sdk.events
// ("prekill", "kill", "killed" and "up", each with its unix ms, written by the C test; from
// prekill to up four more loops send queries to cn1 back to back, so that some are in
// flight when it dies; the C test freezes cn1 for 0.5 s before its SIGKILL, so that they
// are), the rules are checked:
//   - at least one request was in flight on cn1 when it died, and it failed (the error
//     came back, as every other attempt, within 10 s: see below);
//   - every operation was answered in the end (0 unanswered);
//   - no attempt hung: each one returned within 10 s (the SDK's request timeout is 15 s,
//     so a hung one shows as taking longer);
//   - attempts failed only on cn1 and only from 1 s before its kill until 15 s after it was
//     started again (those in flight at the kill, and those sent while it was down or not
//     yet serving); the ones in flight at the kill are counted;
//   - every acknowledged put is listed in CHAOS_DIR/sdk.keys and CHAOS_DIR/sdk.fbin (its
//     vectors) for the C test, which reads each back exactly and looks it up by its own
//     vector through libdmann.
// Prints one "FIGURES chaos sdk: ..." line; exits 0 when the rules hold, 1 otherwise (with
// the reason), 2 on bad setup.
// Environment: S3SDK_NODE_MODULES, CHAOS_DIR, CHAOS_BUCKET, CHAOS_INDEX.
'use strict';

const fs = require('node:fs');
const path = require('node:path');

const MODS = process.env.S3SDK_NODE_MODULES, DIR = process.env.CHAOS_DIR;
const BUCKET = process.env.CHAOS_BUCKET, INDEX = process.env.CHAOS_INDEX;
if (!MODS || !DIR || !BUCKET || !INDEX) {
  console.error('chaos_sdk: S3SDK_NODE_MODULES, CHAOS_DIR, CHAOS_BUCKET, CHAOS_INDEX needed');
  process.exit(2);
}
const sdk = require(path.join(MODS, '@aws-sdk/client-s3vectors'));
const { NodeHttpHandler } = require(path.join(MODS, '@smithy/node-http-handler'));
const D = 32, BATCH = 10, K = 10, HUNG_MS = 10000;

// The gateways' ports, in compute node order, from the cluster file's "http =" lines.
const ini = fs.readFileSync(path.join(DIR, 'cluster.ini'), 'utf8');
const ports = [...ini.matchAll(/^http\s*=\s*[^:\s]+:(\d+)\s*$/gm)].map((m) => Number(m[1]));
if (ports.length < 2) {
  console.error(`chaos_sdk: two gateways expected in ${DIR}/cluster.ini, found ${ports.length}`);
  process.exit(2);
}
const secret = fs.readFileSync(path.join(DIR, 's3.secret'), 'utf8').trim();
const clients = ports.slice(0, 2).map((port) => new sdk.S3VectorsClient({
  endpoint: `http://127.0.0.1:${port}`, region: 'us-east-1', maxAttempts: 3,
  credentials: { accessKeyId: 'DMANNLOCALTEST', secretAccessKey: secret },
  requestHandler: new NodeHttpHandler({ connectionTimeout: 3000, requestTimeout: 15000 }),
}));

// Deterministic vectors: row i of a xorshift stream.
function vec(i) {
  let s = BigInt(i) * 0x9e3779b97f4a7c15n + 0x5bd1e995n & 0xffffffffffffffffn;
  const v = new Array(D);
  for (let j = 0; j < D; j++) {
    s ^= (s << 13n) & 0xffffffffffffffffn; s ^= s >> 7n; s ^= (s << 17n) & 0xffffffffffffffffn;
    v[j] = Number(s >> 40n) / 16777216 - 0.5;
  }
  return v;
}
const keyOf = (i) => `s${String(i).padStart(8, '0')}`;

const attempts = [];            // { ep, t0, t1, ok, err }
let unanswered = 0, ops = 0, stopping = false;
const acked = [];               // indices of acknowledged rows
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One operation: fn(client) on gateway ep, then the other one, up to 4 attempts.
async function op(ep, fn) {
  ops++;
  for (let a = 0; a < 4; a++) {
    const e = (ep + a) % 2, t0 = Date.now();
    try {
      const r = await fn(clients[e]);
      attempts.push({ ep: e, t0, t1: Date.now(), ok: true });
      return r;
    } catch (err) {
      attempts.push({ ep: e, t0, t1: Date.now(), ok: false,
        err: `${err.name}: ${String(err.message).slice(0, 120)}` });
      if (a >= 1) await sleep(1000);
    }
  }
  unanswered++;
  return null;
}

async function writer() {
  for (let b = 0; !stopping; b++) {
    const rows = [];
    for (let i = b * BATCH; i < (b + 1) * BATCH; i++)
      rows.push({ key: keyOf(i), data: { float32: vec(i) }, metadata: { src: 'sdk' } });
    const r = await op(b % 2, (c) => c.send(new sdk.PutVectorsCommand({
      vectorBucketName: BUCKET, indexName: INDEX, vectors: rows })));
    if (r) for (let i = b * BATCH; i < (b + 1) * BATCH; i++) acked.push(i);
    await sleep(1000);
  }
}

async function reader(seed) {
  let s = seed;
  for (let n = 0; !stopping; n++) {
    if (acked.length) {
      s = (s * 1103515245 + 12345) % 2147483648;
      const q = vec(acked[s % acked.length]);
      await op((n + seed) % 2, (c) => c.send(new sdk.QueryVectorsCommand({
        vectorBucketName: BUCKET, indexName: INDEX, queryVector: { float32: q }, topK: K })));
    }
    await sleep(200);
  }
}

function readEvents() {
  const ev = { prekill: 0, kill: 0, killed: 0, up: 0 };
  try {
    for (const l of fs.readFileSync(path.join(DIR, 'sdk.events'), 'utf8').split('\n')) {
      const m = l.match(/^(prekill|kill|killed|up) (\d+)$/);
      if (m) ev[m[1]] = Number(m[2]);
    }
  } catch { /* no kill of cn1 */ }
  return ev;
}

// From "prekill" until "up": four loops of back-to-back queries on cn1 alone, so that
// requests are in flight on it when it is killed (each still goes to cn0 when it fails).
async function burst() {
  while (!stopping && !readEvents().prekill) await sleep(100);
  const loop = async () => {
    while (!stopping && !readEvents().up && acked.length) {
      const q = vec(acked[Math.floor(Math.random() * acked.length)]);
      await op(1, (c) => c.send(new sdk.QueryVectorsCommand({
        vectorBucketName: BUCKET, indexName: INDEX, queryVector: { float32: q }, topK: K })));
    }
  };
  await Promise.all([loop(), loop(), loop(), loop()]);
}

async function main() {
  const loops = [writer(), reader(1), reader(2), burst()];
  while (!fs.existsSync(path.join(DIR, 'sdk.stop'))) await sleep(200);
  stopping = true;
  // None may hang: every loop ends within the SDK's bounds (4 attempts of at most 3 tries
  // of 15 s would be 3 minutes; one that never returns fails the check below).
  const done = await Promise.race([Promise.all(loops).then(() => true),
    sleep(200000).then(() => false)]);
  const { kill, killed, up } = readEvents();
  const slow = attempts.filter((a) => a.t1 - a.t0 > HUNG_MS);
  const failed = attempts.filter((a) => !a.ok);
  const bad = failed.filter((a) => a.ep !== 1 || !kill || !up ||
    a.t1 < kill - 1000 || a.t0 > up + 15000);
  // in flight: sent before the kill command returned, failed after it began
  const inflight = failed.filter((a) => a.ep === 1 && kill && a.t0 < (killed || kill) &&
    a.t1 >= kill);
  const maxErrMs = failed.reduce((m, a) => Math.max(m, a.t1 - a.t0), 0);

  // The acknowledged rows, for the C test.
  const keys = acked.map(keyOf).join('\n') + (acked.length ? '\n' : '');
  fs.writeFileSync(path.join(DIR, 'sdk.keys'), keys);
  const buf = Buffer.alloc(8 + acked.length * D * 4);
  buf.writeInt32LE(acked.length, 0);
  buf.writeInt32LE(D, 4);
  acked.forEach((i, r) => vec(i).forEach((x, j) => buf.writeFloatLE(x, 8 + (r * D + j) * 4)));
  fs.writeFileSync(path.join(DIR, 'sdk.fbin'), buf);
  // cn1's attempts around its kill, for a look at a kept test directory
  fs.writeFileSync(path.join(DIR, 'sdk.cn1.json'), JSON.stringify(attempts.filter((a) =>
    a.ep === 1 && kill && a.t1 >= kill - 3000 && a.t0 <= (up || kill) + 3000)));

  console.log(`FIGURES chaos sdk: ${ops} operations (${acked.length} rows acknowledged), ` +
    `${attempts.length} attempts, ${failed.length} failed (${inflight.length} in flight on ` +
    `cn1 at its kill; slowest error ${maxErrMs} ms), ${unanswered} unanswered, ` +
    `${slow.length} attempts over ${HUNG_MS / 1000} s, ${bad.length} failures outside ` +
    `cn1's kill window`);
  for (const a of bad.slice(0, 10))
    console.log(`chaos_sdk: failure outside the window: cn${a.ep} at ${a.t0} ` +
      `(${a.t1 - a.t0} ms): ${a.err}`);
  const why = [];
  if (!done) why.push('a loop did not end within 200 s (a request hung)');
  if (unanswered) why.push(`${unanswered} operations unanswered on both gateways`);
  if (slow.length) why.push(`${slow.length} attempts took over ${HUNG_MS / 1000} s`);
  if (bad.length) why.push(`${bad.length} attempts failed outside cn1's kill window`);
  if (kill && !inflight.length) why.push('no request was in flight on cn1 when it was killed');
  if (why.length) {
    console.log(`chaos_sdk: FAIL: ${why.join('; ')}`);
    process.exit(1);
  }
  process.exit(0);
}

main().catch((e) => { console.error(`chaos_sdk: ${e.stack}`); process.exit(2); });
