"""The verified-token cache's memory: what one remembered buyer token costs the API process.

Mints ``--tokens`` buyer tokens (subjects as long as the crowd's, ``buyer-123456``), verifies each
once through a ``TokenCodec`` (each lands in its cache), and measures with tracemalloc the memory
the cache holds once the token texts are gone: the entries (a 16-byte digest, the subject, the
role and the times) and the dict that keys them. Then the same for a full cache
(``VERIFIED_CACHE_SIZE`` entries), as a process serving a large sale holds it.

Memory is counted, not timed: the figure is the same on a busy machine. The last line printed is
one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc

from seckill.security.tokens import VERIFIED_CACHE_SIZE, Role, TokenCodec

SECRET = "benchmark-secret-" + "k" * 32


def bytes_per_entry(tokens: int) -> float:
    codec = TokenCodec(
        algorithm="HS256", signing_key=SECRET, verify_key=SECRET, issuer="seckill",
        audience="seckill-api",
    )  # fmt: skip
    now = time.time()
    texts = [
        codec.mint(f"buyer-{n:06d}", Role.BUYER, ttl_seconds=3600, now=now) for n in range(tokens)
    ]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for text in texts:
        codec.verify(text, now=now)
    del texts
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    args = parser.parse_args()
    figures = {
        "tokens": args.tokens,
        "bytes_per_entry": round(bytes_per_entry(args.tokens)),
        "full_cache_entries": VERIFIED_CACHE_SIZE,
    }
    full = bytes_per_entry(VERIFIED_CACHE_SIZE)
    figures["bytes_per_entry_full"] = round(full)
    figures["full_cache_mb"] = round(full * VERIFIED_CACHE_SIZE / 1e6, 1)
    print(
        f"{figures['bytes_per_entry']} bytes per remembered token ({args.tokens:,} tokens); "
        f"{figures['bytes_per_entry_full']} in a full cache of {VERIFIED_CACHE_SIZE:,}: "
        f"{figures['full_cache_mb']} MB"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
