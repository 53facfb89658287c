"""Every measured figure the docs quote is one of today's figures in docs/benchmarks.md.

The pages checked are the README and every page under docs/ but the two benchmark pages
(docs/benchmarks.md, today's figures; docs/benchmarks-history.md, the runs before them).

The rule. A *figure* is a number followed by a unit of what a benchmark measures:

- a time per operation or a latency: ``µs`` (or ``us``), ``ms``, or ``s`` when the number has a
  fraction (``2.3 s``; whole seconds are left out: the pages write settings and timeouts so,
  ``30 s``, ``5 s``);
- a rate: ``/s`` after the number or after a noun (``6,491 req/s``, ``16,000 orders/s``,
  ``40/s``, ``25k/s``);
- memory: ``KB``, ``MB``, ``GB``;
- a share of a processor: ``% of a core`` (``% of a CPU``; a bare ``%`` is a ratio of anything).

Numbers joined by a hyphen or an en dash, ``to``, ``/``, ``and`` or ``or`` before the unit
share it: ``34-41 µs`` is 34 µs and 41 µs, ``54.7 / 62.6 µs`` is 54.7 µs and 62.6 µs. A figure is
compared by value and unit (``16,000/s`` is ``16000 orders/s``; ``us`` is ``µs``), with the
figures docs/benchmarks.md states read by the same rule.

A figure outside docs/benchmarks.md passes when it is one of today's figures there, when it is
derived from one with the derivation written right after it in parentheses, or when it is not
a measurement at all and is listed in ``NOT_MEASURED`` below (a setting's value, a constant, a
benchmark's input), with why. A derivation is arithmetic on figures and plain numbers, with
the multiplication and division signs or ``/`` (words between them are read past): ``about
18,000 purchases/s (1 s of one core ÷ 54.7 µs)``. It must name at least one of today's figures,
and its result must be the derived figure within 5% (the pages round: "about").
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TODAY = ROOT / "docs" / "benchmarks.md"
HISTORY = ROOT / "docs" / "benchmarks-history.md"
PAGES = [
    page
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    if page not in (TODAY, HISTORY)
]

NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?k?"
UNIT = r"µs|us|ms|s|KB|MB|GB|[A-Za-z]*/s|% of (?:a|one) (?:core|CPU)"
JOIN = r"\s*(?:\N{EN DASH}|-|to|/|and|or)\s*"
FIGURE = re.compile(
    rf"(?<![\w.,/-])(?P<numbers>{NUMBER}(?:{JOIN}{NUMBER})*)\s*(?P<unit>{UNIT})(?![\w/])"
)
TIMES, DIVIDED = "\N{MULTIPLICATION SIGN}", "\N{DIVISION SIGN}"
DERIVATION = re.compile(rf"\**\s?\(([^()]*[{TIMES}{DIVIDED}/][^()]*)\)")
TERM = re.compile(
    rf"(?<![\w.,/-])({NUMBER})(?:\s?({UNIT})(?![\w/]))?|([{TIMES}{DIVIDED}])|(?<=\s)(/)(?=\s)"
)
SCALE = {"µs": Decimal("1e-6"), "ms": Decimal("1e-3"), "s": Decimal(1)}

# Figures that are not measurements, per page: (page, the figure as written, why).
NOT_MEASURED = {
    ("docs/architecture.md", "500 ms"): "SECKILL_SOLD_OUT_RECHECK_MS's default",
    ("docs/rehearsing.md", "40/s"): "the hosts rehearsal's arrival rate, an input",
    ("docs/rehearsing.md", "50 ms"): "how often the rehearsal polls a stopping host",
    ("docs/rehearsing.md", "0.5 to 2 s"): "how often a buyer in a waiting room polls",
    ("docs/operations/keys.md", "1 MB"): "the most of a key set the fetch reads",
    ("docs/operations/bridge.md", "10 ms"): "the bridge's first pause when nothing landed",
    ("docs/operations/bridge.md", "0.2 s"): "the bridge's first pause when the broker is down",
    ("docs/operations/redis-cluster.md", "0.25 s"): "how often the cluster client reads the slots",
    ("docs/operations/redis-cluster.md", "0.05 s"): "the fence check the failover test sets",
}


Figure = tuple[Decimal, str]


def value(number: str) -> Decimal:
    digits = number.replace(",", "")
    if digits.endswith("k"):
        return Decimal(digits[:-1]) * 1000
    return Decimal(digits)


def unit_of(unit: str) -> str:
    if unit == "us":
        return "µs"
    if unit.endswith("/s"):
        return "/s"
    if unit.startswith("%"):
        return "% of a core"
    return unit


def figures(text: str) -> list[tuple[re.Match[str], list[Figure]]]:
    """Each figure the text states (by the rule above), with the values it holds."""
    found = []
    for match in FIGURE.finditer(text):
        numbers = re.findall(NUMBER, match["numbers"])
        unit = unit_of(match["unit"])
        if unit == "s" and not any("." in number for number in numbers):
            continue  # whole seconds: a setting or a timeout, not a measurement
        found.append((match, [(value(number), unit) for number in numbers]))
    return found


def todays() -> set[Figure]:
    return {figure for _, held in figures(TODAY.read_text(encoding="utf-8")) for figure in held}


def base(number: Decimal, unit: str | None) -> Decimal:
    """A value in seconds, per second or as is (the units a derivation divides and multiplies)."""
    return number * SCALE.get(unit_of(unit) if unit else "", Decimal(1))


def derived(text: str, match: re.Match[str], measured: set[Figure]) -> str | None:
    """Why the derivation after this figure does not hold it up, or None when it does."""
    derivation = DERIVATION.match(text, match.end())
    if derivation is None:
        return "not in docs/benchmarks.md, and no derivation after it"
    terms = TERM.findall(derivation.group(1))
    result: Decimal | None = None
    operator = None
    named = False
    for number, unit, sign, slash in terms:
        if sign or slash:
            operator = sign or slash
            continue
        term = base(value(number), unit or None)
        named = named or (unit and (value(number), unit_of(unit)) in measured)
        if result is None:
            result = term
        elif operator == TIMES:
            result *= term
        elif operator in (DIVIDED, "/"):
            result /= term
        else:
            return f"cannot read the derivation ({derivation.group(1)})"
        operator = None
    if result is None or not named:
        return f"the derivation ({derivation.group(1)}) names none of today's figures"
    number, unit = match["numbers"], match["unit"]
    stated = base(value(re.findall(NUMBER, number)[-1]), unit)
    if abs(result - stated) > abs(stated) * Decimal("0.05"):
        return f"the derivation ({derivation.group(1)}) gives {result:.4g}, not {match[0]}"
    return None


def test_todays_page_states_figures() -> None:
    # Else every check below would be vacuous.
    assert len(todays()) > 50


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_quoted_is_one_of_todays(page: Path) -> None:
    name = page.relative_to(ROOT).as_posix()
    text = page.read_text(encoding="utf-8")
    measured = todays()
    wrong = []
    for match, held in figures(text):
        if (name, match[0]) in NOT_MEASURED or all(figure in measured for figure in held):
            continue
        why = derived(text, match, measured)
        if why:
            line = text.count("\n", 0, match.start()) + 1
            wrong.append(f"{name}:{line}: {match[0]!r}: {why}")
    assert not wrong, wrong


def test_every_figure_listed_as_not_measured_is_on_its_page() -> None:
    stale = [
        f"{page}: {figure!r}"
        for page, figure in NOT_MEASURED
        if figure not in [match[0] for match, _ in figures((ROOT / page).read_text())]
    ]
    assert not stale, stale
