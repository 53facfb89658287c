"""docs/architecture.md's "Layout" names every module of src/seckill/, and only modules that exist.

The map is the first code block of the section: under its ``src/seckill/`` line, one entry per
module or package of src/seckill/, its name indented two spaces (``config.py``, ``engine/``), what
it holds on the same line and on the lines indented further below. The rules the test reads it
by, so that a module added, moved or removed fails here with its name:

- a ``name.py`` in an entry names a module of the entry's directory (a package's own, or
  src/seckill/ for a module's entry); ``sub/name.py`` one of its subpackage ``sub``;
- ``sub/:`` (a subpackage, then a colon) opens that subpackage: every ``name.py`` after it, to the
  end of the entry, is one of its modules (``reconcile/: drift.py, ...``).

Left out of what must be named: ``__init__.py`` and ``__main__.py`` (a package's entry is the
package), and the migrations in ``store/migrations/versions/`` (one per schema revision; the map
names the directory).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "seckill"
PAGE = ROOT / "docs" / "architecture.md"
ENTRY = re.compile(r"^  (\S+)(.*)$")
# A module: name.py or sub/name.py, not part of a longer path or word (`seckill/api/x.py`).
MODULE = re.compile(r"(?<![\w/.])((?:\w+/)*\w+\.py)\b")
OPENS = re.compile(r"(?<![\w/.])(\w+)/:")


def modules() -> set[str]:
    """Every module the map must name, as a path under src/seckill/."""
    found = set()
    for path in SOURCE.rglob("*.py"):
        name = path.relative_to(SOURCE).as_posix()
        if path.name in ("__init__.py", "__main__.py"):
            continue
        if name.startswith("store/migrations/versions/"):
            continue
        found.add(name)
    return found


def layout_map() -> list[str]:
    """The map's lines, from the one after ``src/seckill/`` to the first one not indented."""
    text = PAGE.read_text(encoding="utf-8")
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert section, "docs/architecture.md has no '## Layout' section"
    block = re.search(r"^```[^\n]*\n(.*?)^```", section.group(1), flags=re.M | re.S)
    assert block, "the Layout section has no code block"
    lines = block.group(1).splitlines()
    assert "src/seckill/" in lines, "the Layout map does not start at src/seckill/"
    lines = lines[lines.index("src/seckill/") + 1 :]
    ends = next((i for i, line in enumerate(lines) if line and not line.startswith(" ")), None)
    return lines[:ends]


def entries() -> list[tuple[str, str]]:
    """Each entry of the map: its name (``config.py``, ``engine/``) and all of its text."""
    found: list[tuple[str, str]] = []
    for line in layout_map():
        entry = ENTRY.match(line)
        if entry:
            found.append((entry.group(1), entry.group(2)))
        elif found and line.strip():
            name, text = found[-1]
            found[-1] = (name, f"{text} {line.strip()}")
    return found


def named() -> tuple[set[str], set[str]]:
    """The modules the map names (paths under src/seckill/), and its packages (``engine/``)."""
    names, packages = set(), set()
    for entry, text in entries():
        if entry.endswith("/"):
            packages.add(entry)
            base = entry
        else:
            names.add(entry)
            base = ""
        opened = OPENS.search(text)
        for found in MODULE.finditer(text):
            inner = opened and found.start() > opened.end()
            names.add(f"{base}{opened.group(1)}/{found.group(1)}" if inner else base + found[1])
    return names, packages


def test_the_map_can_be_read() -> None:
    names, packages = named()
    assert "config.py" in names and "engine/" in packages, "the map's entries were not found"


def test_every_module_is_in_the_layout_map() -> None:
    missing = sorted(modules() - named()[0])
    assert not missing, (
        "docs/architecture.md § Layout does not name these modules of src/seckill/ (add each to "
        f"its directory's entry, with what it is for): {missing}"
    )


def test_the_layout_map_names_no_module_that_does_not_exist() -> None:
    names, packages = named()
    stale = sorted(name for name in names if not (SOURCE / name).is_file())
    stale += sorted(package for package in packages if not (SOURCE / package).is_dir())
    assert not stale, (
        f"docs/architecture.md § Layout names what src/seckill/ does not have: {stale}"
    )
