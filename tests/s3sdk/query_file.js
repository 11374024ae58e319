// query_file.js: the AWS SDK's side of the client comparison (tests/test_client.c): run
// QueryVectors for every float32 query of a raw file against a compute node's gateway and
// print "key distance" per result (k lines per query), as the C test prints libdmann's.
// usage: node query_file.js NODE_MODULES ENDPOINT ACCESS_KEY SECRET_FILE BUCKET INDEX
//                           QUERIES.f32 DIM K
'use strict';
const fs = require('node:fs');
const path = require('node:path');

const [mods, endpoint, ak, skFile, bucket, index, qfile, dimS, kS] = process.argv.slice(2);
const sdk = require(path.join(mods, '@aws-sdk/client-s3vectors'));
const dim = Number(dimS), k = Number(kS);
const buf = fs.readFileSync(qfile);
const q = new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4);
const c = new sdk.S3VectorsClient({
  endpoint, region: 'us-east-1', maxAttempts: 1,
  credentials: { accessKeyId: ak, secretAccessKey: fs.readFileSync(skFile, 'utf8').trim() },
});

(async () => {
  const out = [];
  for (let i = 0; i < q.length / dim; i++) {
    const r = await c.send(new sdk.QueryVectorsCommand({
      vectorBucketName: bucket, indexName: index, topK: k, returnDistance: true,
      queryVector: { float32: Array.from(q.subarray(i * dim, (i + 1) * dim)) },
    }));
    for (const v of r.vectors) out.push(`${v.key} ${v.distance}`);
  }
  process.stdout.write(out.join('\n') + '\n');
})().catch((e) => { console.error(e); process.exit(1); });
