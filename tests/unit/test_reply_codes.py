"""The reply and error codes each script declares in its header equal the Python enums."""

from __future__ import annotations

import re

import pytest

from seckill.domain.events import ReleaseReason
from seckill.domain.outcomes import ErrorCode, Outcome
from seckill.engine.scripts import (
    HOLD_SCRIPTS,
    ITEM_SCRIPTS,
    LUA_DIR,
    PAYMENT_SCRIPTS,
    QUEUE_SCRIPTS,
    ScriptName,
)

# Validated by Python alone: whether an item is archived, or settled, or its sale begun (before
# ending it), is SQL's to say; which consumer groups follow the streams is no script's business.
PYTHON_ONLY_ERRORS = {
    ErrorCode.ITEM_ARCHIVED,
    ErrorCode.ITEM_UNSETTLED,
    ErrorCode.INVALID_GROUP,
    ErrorCode.SALE_NOT_STARTED,
}


def _header(name: str) -> str:
    lines = (LUA_DIR / f"{name}.lua").read_text().splitlines()
    return "\n".join(line for line in lines if line.startswith("--")).split("\n\n")[0]


def _section(header: str, title: str) -> str:
    match = re.search(rf"^-- {title}.*?$(.*?)(?=^-- [A-Z]|\Z)", header, re.M | re.S)
    return match.group(1) if match else ""


def declared(name: str) -> tuple[set[str], set[str]]:
    """(reply codes, error codes) named in a script's header."""
    header = _header(name)
    replies = set(re.findall(r"^--   ([a-z_]+)\s", _section(header, "Replies"), re.M))
    errors = set(re.findall(r"[a-z]+_[a-z_]+", _section(header, "Errors")))
    return replies, errors


def body_codes(source: str) -> tuple[set[str], set[str]]:
    """Codes a Lua source replies with: `{ "code"`, `invalid("code"` and the shared `bad_x(`
    helpers of _common.lua (each refuses with `invalid_x`)."""
    replies = set(re.findall(r'return \{ "([a-z_]+)"', source))
    errors = set(re.findall(r'invalid\("([a-z_]+)"', source))
    errors |= {f"invalid_{name}" for name in re.findall(r"\bbad_([a-z_]+)\(", source)}
    return replies, errors


HELPER_FILES = ("_common", "_holds", "_payments", "_queue")
DECIDING_SCRIPTS = ITEM_SCRIPTS | QUEUE_SCRIPTS  # the ones that reply with outcomes


def shared_source() -> str:
    return "".join((LUA_DIR / f"{name}.lua").read_text() for name in HELPER_FILES)


def common_helpers() -> dict[str, str]:
    """Each `local function` of the shared helper files, by name, with its body."""
    shared = shared_source()
    found = re.findall(r"^local function (\w+)\(.*?^end$", shared, re.M | re.S)
    bodies = re.findall(r"^(local function \w+\(.*?^end)$", shared, re.M | re.S)
    return dict(zip(found, bodies, strict=True))


def script_codes(name: str) -> tuple[set[str], set[str]]:
    """Codes a script replies with, its own and those of the shared helpers it calls (and the
    helpers they call)."""
    helpers = common_helpers()
    source = (LUA_DIR / f"{name}.lua").read_text()
    replies, errors = body_codes(source)
    called: set[str] = set()
    pending = [source]
    while pending:
        text = pending.pop()
        for helper, body in helpers.items():
            if helper not in called and re.search(rf"\b{helper}\(", text):
                called.add(helper)
                pending.append(body.split("\n", 1)[1])  # the body, without its own signature
                r, e = body_codes(body)
                replies |= r
                errors |= e
    return replies, errors


def test_the_shared_helpers_are_found() -> None:
    helpers = common_helpers()
    assert {"release_hold", "notice_args", "recorded_payment"} <= helpers.keys()
    assert body_codes(helpers["recorded_payment"])[1] == {"payment_id_reused"}


@pytest.mark.parametrize(
    ("helper_file", "scripts", "extra"),
    [("_holds", HOLD_SCRIPTS, {"RELEASE_REASONS"}), ("_payments", PAYMENT_SCRIPTS, set())],
)
def test_scripts_are_sent_with_the_helpers_they_use(
    helper_file: str, scripts: frozenset[ScriptName], extra: set[str]
) -> None:
    text = (LUA_DIR / f"{helper_file}.lua").read_text()
    names = {*re.findall(r"^local function (\w+)\(", text, re.M), *extra}
    for name in ScriptName:
        source = (LUA_DIR / f"{name}.lua").read_text()
        used = {n for n in names if re.search(rf"\b{n}\b", source)}
        assert not used or name in scripts, f"{name}.lua uses {used} of {helper_file}.lua"


@pytest.mark.parametrize("name", sorted(DECIDING_SCRIPTS))
def test_each_script_replies_only_what_its_header_declares(name: ScriptName) -> None:
    declared_replies, declared_errors = declared(name)
    used_replies, used_errors = script_codes(name)
    assert used_replies <= declared_replies
    assert used_errors <= declared_errors
    assert declared_errors, f"{name}.lua declares no errors"


@pytest.mark.parametrize("name", sorted(PAYMENT_SCRIPTS))
def test_notice_scripts_share_one_rule_for_payment_ids(name: ScriptName) -> None:
    """settle_payment and claim_payment read a notice and its payment id's record in one place:
    a payment id belongs to one order and result, on the item's head as on a shard."""
    source = (LUA_DIR / f"{name}.lua").read_text()
    assert re.search(r"\bnotice_args\(", source) and re.search(r"\brecorded_payment\(", source)
    assert "payment_id_reused" not in source.split("\n\n", 1)[1]  # only in its header


def test_the_shared_refusals_are_declared_codes() -> None:
    _, errors = body_codes(shared_source())
    assert errors
    assert errors <= {e.value for e in ErrorCode}


def test_declared_codes_equal_the_python_enums() -> None:
    replies: set[str] = set()
    errors: set[str] = set()
    for name in DECIDING_SCRIPTS:
        r, e = declared(name)
        replies |= r
        errors |= e
    assert replies == {o.value for o in Outcome}
    assert errors == {e.value for e in ErrorCode} - PYTHON_ONLY_ERRORS


def test_release_reasons_agree() -> None:
    table = re.search(r"RELEASE_REASONS = \{(.*?)\}", shared_source())
    assert table is not None
    assert set(re.findall(r"([a-z_]+) = true", table.group(1))) == {r.value for r in ReleaseReason}


def test_every_script_file_is_named_in_the_enum() -> None:
    files = {p.name.removesuffix(".lua") for p in LUA_DIR.iterdir() if p.name.endswith(".lua")}
    assert files - set(HELPER_FILES) == {n.value for n in ScriptName}
