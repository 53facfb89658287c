"""Names and ids hold no control character, on every SQL backend alike: PostgreSQL refuses a NUL
in text (a 500 before this rule) where SQLite and MariaDB keep it, and a terminal or a log shows
an escape sequence as something else than it is. The refusal is a 422 naming the field, and
nothing is created."""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.redis_variants("redis7")


@pytest.mark.parametrize(
    "name", ["a\x00b", "\x1b[31mred", "line\nbreak", "del\x7f", "c1\x85", "lone\ud800"]
)
async def test_an_item_name_with_a_control_character_is_refused(api: Api, name: str) -> None:
    body = {
        "name": name,
        "price_cents": 100,
        "total": 5,
        "starts_at": "2030-01-01T00:00:00Z",
        "ends_at": "2030-01-01T01:00:00Z",
    }
    refused = await api.http.post(
        "/api/v1/admin/items",
        headers={**api.as_admin, "Content-Type": "application/json"},
        content=json.dumps(body).encode(),  # ASCII, with every such character escaped
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["message"].startswith("body.name: "), refused.text
    listed = await api.http.get("/api/v1/admin/items", headers=api.as_admin)
    assert listed.json()["items"] == []
    # The same item named plainly is created, unicode and all.
    body["name"] = "Téléphone 手机 📱"
    created = await api.http.post("/api/v1/admin/items", headers=api.as_admin, json=body)
    assert created.status_code == 201, created.text
    assert created.json()["name"] == body["name"]


@pytest.mark.parametrize("field", ["ids", "group"])
async def test_a_dead_letter_id_or_group_with_a_control_character_is_refused(
    api: Api, field: str
) -> None:
    body = {"ids": ["1-1"], field: ["1\x00"] if field == "ids" else "persister\x00"}
    for action in ("replay", "drop"):
        refused = await api.http.post(
            f"/api/v1/admin/dead-letters/{action}", headers=api.as_admin, json=body
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["message"].startswith(f"body.{field}"), refused.text
