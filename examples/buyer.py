"""A buyer's whole purchase against a seckill API, with httpx: the item, a ticket, the purchase
(with an Idempotency-Key, retried with the same key when told to come back), then the order.

    SECKILL_TOKEN=... python examples/buyer.py --url http://127.0.0.1:8000 ITEM_ID

The token is a buyer's bearer token (``seckill token --buyer NAME`` mints one on a test
deployment). Prints the order as the API answers it, as one JSON line, and exits 0 when it is
held (pay before ``pay_before``) or paid, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

import httpx

ATTEMPTS = 5  # a purchase told to come back (429, 503, 409 request_in_flight) is asked again


def buy(http: httpx.Client, item_id: int) -> dict[str, Any]:
    """The order after one purchase of one unit: item, ticket, purchase, then the order."""
    item = http.get(f"/api/v1/items/{item_id}")
    item.raise_for_status()
    card = item.json()
    # The shop charges price_cents (minor units: cents of EUR, yen of JPY) times the quantity,
    # in the item's currency: the sum seckill's payment notice must carry.
    price = f"{card['price_cents']} {card['currency']} (minor units) each"
    print(f"item {item_id}: {card['name']}, {price}, {card['available']} left", file=sys.stderr)

    ticket = http.post(f"/api/v1/items/{item_id}/tickets")
    if ticket.status_code != 200:
        return ticket.json()  # {"error": ..., "message": ...}: not_started, ended, sold_out, ...

    # One key per purchase the buyer means: a retry with it can never buy twice.
    key = str(uuid.uuid4())
    for _ in range(ATTEMPTS):
        bought = http.post(
            f"/api/v1/items/{item_id}/orders",
            headers={"Idempotency-Key": key, "Seckill-Ticket": ticket.json()["ticket"]},
            json={"quantity": 1},
        )
        retry_after = bought.headers.get("Retry-After")
        if bought.status_code in (409, 429, 503) and retry_after is not None:
            time.sleep(int(retry_after))
            continue
        break
    if bought.status_code != 202:
        return bought.json()  # sold_out, limit_reached, ...

    order_id = bought.json()["order_id"]  # a decimal string: 64 bits
    order = http.get(f"/api/v1/items/{item_id}/orders/{order_id}")
    order.raise_for_status()
    return order.json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("item_id", type=int)
    parser.add_argument("--url", default=os.environ.get("SECKILL_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("SECKILL_TOKEN"))
    args = parser.parse_args()
    if not args.token:
        parser.error("a buyer's token: --token or SECKILL_TOKEN")
    headers = {"Authorization": f"Bearer {args.token}"}
    with httpx.Client(base_url=args.url, headers=headers, timeout=10) as http:
        result = buy(http, args.item_id)
    print(json.dumps(result))
    return 0 if result.get("status") in ("held", "paid") else 1


if __name__ == "__main__":
    sys.exit(main())
