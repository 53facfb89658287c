"""The client kit against a live `seckill serve`: examples/buyer.py (httpx) and
examples/buyer.js (Node's fetch) each buy a unit of an item and report the order held;
examples/notify.py, the provider's side, pays a held order with its sum after a charge a cent
short came back as a refund owed; and every path, method, header and status they rely on is one
the served OpenAPI schema declares, so a client generated from it does what they do."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_serve import call, env_for, free_port, token, wait_until_serving

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN_TIMEOUT_S = 60
PAYMENT_SECRET = "kit-payment-secret-" + "k" * 16  # 32 bytes, the least a key may have
PRICE_CENTS, CURRENCY = 2500, "EUR"


@dataclass(frozen=True)
class Served:
    base: str
    env: dict[str, str]
    item_id: int


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data_dir = tmp_path_factory.mktemp("examples")
    port = free_port()
    env = env_for(data_dir, port) | {"SECKILL_PAYMENT_SECRET": PAYMENT_SECRET}
    base = f"http://127.0.0.1:{port}"
    log_path = data_dir / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "seckill.cli", "serve"], env=env, stdout=log, stderr=log
        )
        try:
            wait_until_serving(server, base, log_path)
            admin = token(env, "--admin")
            now = datetime.now(UTC)
            status, item = call(
                "POST", f"{base}/api/v1/admin/items", admin,
                {"name": "Kit lamp", "price_cents": PRICE_CENTS, "currency": CURRENCY,
                 "total": 10, "per_buyer_limit": 1,
                 "starts_at": (now - timedelta(minutes=1)).isoformat(),
                 "ends_at": (now + timedelta(hours=1)).isoformat()},
            )  # fmt: skip
            assert status == 201, item
            warmed = call("POST", f"{base}/api/v1/admin/items/{item['item_id']}/warm", admin)
            assert warmed[0] == 200, warmed
            yield Served(base, env, int(item["item_id"]))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=20)


def run(command: list[str], served: Served, buyer: str) -> dict[str, Any]:
    """Run an example as a buyer (its token in SECKILL_TOKEN); the order it printed."""
    env = served.env | {"SECKILL_TOKEN": token(served.env, "--buyer", buyer)}
    return printed([*command, "--url", served.base, str(served.item_id)], env)


def printed(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """What an example printed last (one JSON line), once it exited 0."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def held(order: dict[str, Any], item_id: int) -> None:
    assert order["status"] == "held", order
    assert order["item_id"] == item_id
    assert order["quantity"] == 1
    assert re.fullmatch(r"[0-9]+", order["order_id"]), order  # a string: 64 bits
    assert order["pay_before"] is not None


def test_the_python_example_buys_and_reports_a_held_order(served: Served) -> None:
    held(run([sys.executable, str(EXAMPLES / "buyer.py")], served, "py-buyer"), served.item_id)


def test_the_js_example_buys_and_reports_a_held_order(served: Served) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: examples/buyer.js needs Node 20 or later")
    held(run([node, str(EXAMPLES / "buyer.js")], served, "js-buyer"), served.item_id)


def test_the_notice_example_pays_a_held_order_with_its_sum_and_no_other(served: Served) -> None:
    order = run([sys.executable, str(EXAMPLES / "buyer.py")], served, "paying-buyer")
    held(order, served.item_id)

    def notify(payment_id: str, amount: int) -> dict[str, Any]:
        return printed(
            [sys.executable, str(EXAMPLES / "notify.py"), "--url", served.base,
             str(served.item_id), order["order_id"], payment_id,
             "--amount", str(amount), "--currency", CURRENCY],
            served.env,
        )  # fmt: skip

    short = notify("kit-short", PRICE_CENTS - 1)
    assert (short["outcome"], short["refund_reason"]) == ("refund_required", "amount_mismatch")
    assert short["order_status"] == "held"  # still payable
    paid = notify("kit-pay", PRICE_CENTS)
    assert (paid["outcome"], paid["order_status"]) == ("paid", "paid"), paid
    assert notify("kit-pay", PRICE_CENTS)["replayed"] is True


def test_the_notice_example_sends_what_the_schema_requires(served: Served) -> None:
    source = (EXAMPLES / "notify.py").read_text()
    assert paths_in(source) == {"/api/v1/payments/callback"}
    assert "Seckill-Signature" in source and "Retry-After" in source
    status, schema = call("GET", f"{served.base}/openapi.json")
    assert status == 200
    callback = schema["paths"]["/api/v1/payments/callback"]["post"]
    notice = callback["requestBody"]["content"]["application/json"]["schema"]
    sent = {"payment_id", "item_id", "order_id", "status", "amount", "currency"}
    assert set(notice["properties"]) == sent
    assert set(notice["required"]) == sent
    assert "Retry-After" in callback["responses"]["503"]["headers"]


# What the examples rely on: each (method, path) with the headers it sends and the statuses it
# reads; the statuses that come with Retry-After, which they wait out before asking again.
USED = {
    ("get", "/api/v1/items/{item_id}"): ((), ("200",)),
    ("post", "/api/v1/items/{item_id}/tickets"): ((), ("200",)),
    ("post", "/api/v1/items/{item_id}/orders"): (
        ("Idempotency-Key", "Seckill-Ticket"),
        ("202", "409", "429", "503"),
    ),
    ("get", "/api/v1/items/{item_id}/orders/{order_id}"): ((), ("200",)),
}
RETRIED = ("409", "429", "503")
# How each example spells a path's parameters.
PLACEHOLDERS = {
    "{item_id}": "{item_id}", "${itemId}": "{item_id}",
    "{order_id}": "{order_id}", "${orderId}": "{order_id}",
}  # fmt: skip


def paths_in(source: str) -> set[str]:
    found = set()
    for path in re.findall(r"/api/v1/[A-Za-z0-9_{}$/]+", source):
        for spelled, template in PLACEHOLDERS.items():
            path = path.replace(spelled, template)
        found.add(path)
    return found


@pytest.mark.parametrize("example", ["buyer.py", "buyer.js"])
def test_the_examples_use_only_what_the_schema_declares(served: Served, example: str) -> None:
    source = (EXAMPLES / example).read_text()
    assert paths_in(source) == {path for _, path in USED}, "USED no longer says what it uses"
    for header in ("Idempotency-Key", "Seckill-Ticket", "Retry-After", "Authorization"):
        assert header in source

    status, schema = call("GET", f"{served.base}/openapi.json")
    assert status == 200
    for (method, path), (headers, statuses) in USED.items():
        operation = schema["paths"][path][method]
        parameters = {(p["in"], p["name"]): p for p in operation.get("parameters", [])}
        for name in re.findall(r"{(\w+)}", path):
            assert parameters[("path", name)]["required"], (path, name)
        for header in headers:
            assert ("header", header) in parameters, (method, path, header)
        if "Idempotency-Key" in headers:
            assert parameters[("header", "Idempotency-Key")]["required"] is True
        for answer in statuses:
            assert answer in operation["responses"], (method, path, answer)
            if answer in RETRIED:
                assert "Retry-After" in operation["responses"][answer]["headers"], answer
        if path != "/api/v1/items/{item_id}":  # the item card is public
            assert operation["security"] == [{"HTTPBearer": []}], (method, path)
    reservation = schema["components"]["schemas"]["ReservationOut"]["properties"]
    assert reservation["order_id"]["type"] == "string"
    order = schema["components"]["schemas"]["OrderOut"]
    assert {"order_id", "item_id", "quantity", "status", "pay_before"} <= set(order["required"])
