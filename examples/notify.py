"""A payment's outcome told to a seckill API, as a shop's relay from its payment provider's
webhook tells it: the order, whether the charge succeeded, and the sum charged with its currency,
signed with the secret seckill shares with the provider.

    SECKILL_PAYMENT_SECRET=... python examples/notify.py --url http://127.0.0.1:8000 \\
        ITEM_ID ORDER_ID PAYMENT_ID --amount 2500 --currency EUR [--failed]

``--amount`` is what the provider took, in minor units of ``--currency`` (cents of EUR, yen of
JPY): the order's sum (the item's ``price_cents`` times the quantity, in the item's currency)
pays it; any other sum or currency is a refund owed of what was taken. While seckill answers 503
with Retry-After (it does not hold the notice durably yet), the same notice is sent again, as a
provider retries: a retry gets the first answer. Prints the answer as one JSON line and exits 0
on a 200 (``paid``, ``released``, or ``refund_required``: the money is owed back), 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
import time
from typing import Any

import httpx

ATTEMPTS = 5  # sends of a notice seckill answered 503 with Retry-After


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """The Seckill-Signature header: HMAC-SHA256 over ``<timestamp>.`` and the exact body."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def notify(http: httpx.Client, secret: str, notice: dict[str, Any]) -> httpx.Response:
    """Send the signed notice until it is answered other than 503 with Retry-After."""
    body = json.dumps(notice).encode()  # signed and sent as these very bytes
    for _ in range(ATTEMPTS):
        answer = http.post(
            "/api/v1/payments/callback",
            content=body,
            headers={
                "Content-Type": "application/json",
                # Signed anew each time: a signature older than seckill's tolerance is refused.
                "Seckill-Signature": signature(secret, body, int(time.time())),
            },
        )
        retry_after = answer.headers.get("Retry-After")
        if answer.status_code == 503 and retry_after is not None:
            time.sleep(int(retry_after))
            continue
        break
    return answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("item_id", type=int)
    parser.add_argument("order_id", help="a decimal string, as the purchase answered it")
    parser.add_argument("payment_id", help="the provider's id of the charge")
    parser.add_argument("--amount", type=int, required=True, help="minor units charged")
    parser.add_argument("--currency", required=True, help="ISO 4217 code: EUR, USD, JPY...")
    parser.add_argument("--failed", action="store_true", help="the charge failed")
    parser.add_argument("--url", default=os.environ.get("SECKILL_URL", "http://127.0.0.1:8000"))
    args = parser.parse_args()
    secret = os.environ.get("SECKILL_PAYMENT_SECRET")
    if not secret:  # never on the command line: it would show in the process list
        parser.error("the shared secret: SECKILL_PAYMENT_SECRET")
    notice = {
        "payment_id": args.payment_id,
        "item_id": args.item_id,
        "order_id": args.order_id,  # a string: 64 bits
        "status": "failed" if args.failed else "succeeded",
        "amount": args.amount,
        "currency": args.currency,
    }
    with httpx.Client(base_url=args.url, timeout=10) as http:
        answer = notify(http, secret, notice)
    print(json.dumps(answer.json()))
    return 0 if answer.status_code == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
