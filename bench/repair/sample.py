#!/usr/bin/python3
"""bench/repair/sample.py: the S3 rows bench/repair/run.sh checks after its kills.

  sample.py pick BASE.fbin M OUT.fbin OUT.keys
      M rows of BASE (a fixed random sample), their vectors to OUT.fbin and their keys
      (v<row>, the keys `dmann put` gives) to OUT.keys, one per line.
  sample.py check OUT.fbin OUT.keys GET.json QUERY.json
      prints "got found asked": rows whose `dmann get --json` answer is their key with
      exactly the vector put, and whose `dmann query --k 1 --json` answer is their own key.
"""
import array
import json
import random
import struct
import sys


def pick(src, m, out, keys):
    with open(src, "rb") as f:
        n, d = struct.unpack("<ii", f.read(8))
        rows = random.Random(7).sample(range(n), min(m, n))
        with open(out, "wb") as o, open(keys, "w") as k:
            o.write(struct.pack("<ii", len(rows), d))
            for r in rows:
                f.seek(8 + r * d * 4)
                o.write(f.read(d * 4))
                k.write("v%d\n" % r)


def check(fb, kf, gf, qf):
    with open(fb, "rb") as f:
        n, d = struct.unpack("<ii", f.read(8))
        vec = array.array("f")
        vec.frombytes(f.read(n * d * 4))
    keys = open(kf).read().split()
    got = found = 0
    for i, r in enumerate(json.loads(open(gf).read())):
        if i < len(keys) and r.get("key") == keys[i] and r.get("found") and \
                array.array("f", r["float32"]) == vec[i * d:(i + 1) * d]:
            got += 1
    for line in open(qf):
        q = json.loads(line)
        if q["vectors"] and q["query"] < len(keys) and q["vectors"][0]["key"] == keys[q["query"]]:
            found += 1
    print(got, found, len(keys))


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "pick":
        pick(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    elif len(sys.argv) == 6 and sys.argv[1] == "check":
        check(*sys.argv[2:6])
    else:
        sys.exit(__doc__)
