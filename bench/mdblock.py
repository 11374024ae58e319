#!/usr/bin/python3
"""bench/mdblock.py: the one writer of the generated blocks of docs/benchmarks.md.

put_block(md_path, tag, block, heading=None) replaces whatever is between the markers
<!-- BEGIN tag --> and <!-- END tag --> with the block (one newline on either side); when the
file has no <!-- BEGIN tag -->, it appends the marked block at the end of the file, after one
blank line and, when heading is given, the heading and another blank line. A BEGIN marker
without its END leaves the file as it was.

The bench scripts' python code imports it (sys.path.insert(0, <repo root>/bench)); the shell
scripts run it as a command, the block on stdin (one trailing newline dropped):

    python3 bench/mdblock.py DOC TAG [--heading H] < block.md

Standard library only.
"""
import argparse
import os
import re
import sys

# The file's bytes pass through unchanged outside the block: no newline translation, and
# bytes that are not UTF-8 survive as surrogates.
_IO = {"encoding": "utf-8", "errors": "surrogateescape", "newline": ""}


def put_block(md_path, tag, block, heading=None):
    """Write block between md_path's markers of tag, or append it marked (see above)."""
    b, e = "<!-- BEGIN %s -->" % tag, "<!-- END %s -->" % tag
    with open(md_path, **_IO) as f:
        text = f.read()
    if b in text:
        # a function, not a replacement string: backslashes in the block are not escapes
        text = re.sub(re.escape(b) + ".*?" + re.escape(e), lambda _: b + "\n" + block + "\n" + e,
                      text, flags=re.S)
    else:
        text = (text.rstrip("\n") + "\n\n" + (heading + "\n\n" if heading else "") +
                b + "\n" + block + "\n" + e + "\n")
    tmp = md_path + ".tmp"
    with open(tmp, "w", **_IO) as f:
        f.write(text)
    os.replace(tmp, md_path)


def main():
    p = argparse.ArgumentParser(description="Write stdin between DOC's <!-- BEGIN TAG --> and "
                                "<!-- END TAG --> markers (appended at the end when absent).")
    p.add_argument("doc")
    p.add_argument("tag")
    p.add_argument("--heading", help="line put before the markers when they are appended")
    a = p.parse_args()
    block = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
    if block.endswith("\n"):
        block = block[:-1]
    put_block(a.doc, a.tag, block, a.heading)


if __name__ == "__main__":
    main()
