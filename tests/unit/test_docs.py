"""The README and docs/ link to each other: every relative link names a file that exists and,
with an anchor, a heading that file has (GitHub's anchors: lower case, punctuation dropped,
spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from seckill.cli.settings import settings_reference
from seckill.config import Settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no headings in code
    titles = re.findall(r"^#+ (.*)", text, flags=re.M)
    # As GitHub makes them: lower case, spaces to hyphens, only letters, digits, - and _ kept.
    return {re.sub(r"[^a-z0-9 _-]", "", t.lower()).replace(" ", "-") for t in titles}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_between_the_pages_resolves(page: Path) -> None:
    broken = []
    for path, anchor in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", path):  # http:, https:, mailto:
            continue
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{path}: no such file")
        elif anchor and anchor not in anchors(target):
            broken.append(f"{path}#{anchor}: no such heading")
    assert not broken, broken


def test_every_page_of_docs_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    unlinked = [p for p in PAGES[1:] if f"({p.relative_to(ROOT)}" not in readme]
    assert not unlinked, unlinked


def test_the_configuration_page_is_what_the_settings_say() -> None:
    page = ROOT / "docs" / "operations" / "configuration.md"
    assert page.read_text() == settings_reference(), (
        "docs/operations/configuration.md is stale: run "
        "`seckill config docs > docs/operations/configuration.md`"
    )


def test_the_configuration_page_names_every_setting_once() -> None:
    page = settings_reference()
    for name in Settings.model_fields:
        assert page.count(f"`SECKILL_{name.upper()}`") == 1, name
