"""Replay's first stage alone: read a file and turn it into events with its format's
parser (``tillerman.monitor``), nothing else: no projection, no rules, no ledger.

    python -m bench.parse_only FILE...

Same chunked read as ``tillerman replay`` and ``bench.floor``, so its ratio to the
floor is the cost of parsing over decoding every line.
"""

import sys

from bench.floor import CHUNK
from tillerman.monitor.formats import PARSERS, detect_format


def parse_all(path: str) -> int:
    with open(path, "rb") as fh:
        parser = PARSERS[detect_format(fh.read(CHUNK), path)](source=path)
        fh.seek(0)
        events = 0
        while chunk := fh.read(CHUNK):
            events += len(parser.feed(chunk))
    return events + len(parser.close())


if __name__ == "__main__":
    print(sum(parse_all(p) for p in sys.argv[1:]))
