"""The replay floor: read a JSONL file and decode every line with one reused
``msgspec.json.Decoder()`` into plain Python objects, nothing else.

    python -m bench.floor FILE...

Same chunked read as ``tillerman replay`` (``tillerman.controller.replay.replayer.CHUNK``), so the
comparison is about what happens to each line, not about how the file is read.
"""

import sys

import msgspec

CHUNK = 1 << 20


def decode_all(path: str) -> int:
    decode = msgspec.json.Decoder().decode
    count = 0
    tail = b""
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            for line in lines:
                if line:
                    decode(line)
                    count += 1
    if tail.strip():
        decode(tail)
        count += 1
    return count


if __name__ == "__main__":
    print(sum(decode_all(p) for p in sys.argv[1:]))
