"""What a node request token costs, and what binding a block's bytes by SHA-256 would cost.

    .venv/bin/python bench/token_bench.py            # a few seconds
    .venv/bin/python bench/token_bench.py --quick    # a smoke run

Why: every request to a storage node carries a token (shoal/storage/auth.py) that binds the
whole request and is accepted once. The data path sends thousands of small block requests a
second, so the token's own cost matters, and so does the choice of what binds a block PUT's
body: its XXH3-128 checksum, which the writer computes and the node checks anyway, or a
SHA-256 of the bytes, which both would compute again for every replica.

What is measured, in this process, on one core:

  sign                   auth.sign of a block GET (HMAC-SHA256 and a nonce)
  verify + replay cache  auth.verify of fresh tokens, with the node's ReplayCache (a bucket
                         looked at under a thread lock and a flock)
  XXH3-128 of 1 MiB      blockfile.checksum_of, what a block PUT already pays on both sides
  SHA-256 of 1 MiB       hashlib.sha256, what binding the body by its digest would add
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
from pathlib import Path

from benchlib import per_call

from shoal.storage.auth import ReplayCache, Signed, sign, verify
from shoal.storage.blockfile import checksum_of

SECRET = os.urandom(32)
GET = Signed.request("127.0.0.1:9100", "GET", "/blocks/0192f0e0-0000-7000-8000-000000000000.0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    args = parser.parse_args()
    calls = 2_000 if args.quick else 20_000
    block = os.urandom(1024 * 1024)
    with tempfile.TemporaryDirectory() as scratch:
        replays = ReplayCache(Path(scratch) / "replay.lock")
        tokens = iter([sign(SECRET, GET) for _ in range(3 * calls)])
        rows = [
            ("sign", per_call(lambda: sign(SECRET, GET), calls)),
            (
                "verify + replay cache",
                per_call(lambda: verify(SECRET, GET, next(tokens), replays), calls),
            ),
            ("XXH3-128 of 1 MiB", per_call(lambda: checksum_of(block), max(50, calls // 100))),
            (
                "SHA-256 of 1 MiB",
                per_call(lambda: hashlib.sha256(block).digest(), max(50, calls // 100)),
            ),
        ]
    print(f"{'what':<24}{'us per call':>12}")
    for what, seconds in rows:
        print(f"{what:<24}{seconds * 1e6:>12.1f}")
    xxh3, sha = rows[2][1], rows[3][1]
    print(f"SHA-256 / XXH3-128 of a 1 MiB block: {sha / xxh3:.0f}x")


if __name__ == "__main__":
    main()
