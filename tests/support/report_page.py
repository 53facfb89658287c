"""Reading a crowd report the way a browser would: the embedded result, the tables with their
exact figures, and everything the page would load."""

from __future__ import annotations

import json
from dataclasses import dataclass
from html.parser import HTMLParser
from itertools import chain


@dataclass
class Cell:
    text: str = ""
    field: str | None = None
    value: str | None = None


class Page(HTMLParser):
    """What a browser would take from the page: the embedded result, the tables, the loads."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.result_text: str | None = None
        self.status = ""
        self.tables: dict[str, list[list[Cell]]] = {}
        self.urls: list[str] = []  # every src= and href= value
        self.scripts: list[dict[str, str | None]] = []  # each <script>'s attributes
        self.script_texts: list[str] = []
        self.start_tags: list[str] = []
        self._table: str | None = None
        self._cell: Cell | None = None
        self._in_script = False
        self._in_status = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.start_tags.append(tag)
        self.urls += [value or "" for name, value in attrs if name in ("src", "href")]
        if tag == "script":
            self.scripts.append(found)
            self.script_texts.append("")
            self._in_script = True
        elif tag == "table":
            self._table = found.get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = Cell(field=found.get("data-field"), value=found.get("data-value"))
            self.tables[self._table][-1].append(self._cell)
        elif found.get("id") == "status":
            self._in_status = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False
        elif tag == "table":
            self._table = None
        elif tag in ("td", "th"):
            self._cell = None
        elif tag == "h1":
            self._in_status = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.script_texts[-1] += data
            if self.scripts[-1].get("id") == "crowd-result":
                self.result_text = (self.result_text or "") + data
        if self._cell is not None:
            self._cell.text += data
        if self._in_status:
            self.status += data


def parse(page: str) -> Page:
    parsed = Page()
    parsed.feed(page)
    parsed.close()
    return parsed


def body_rows(parsed: Page, table: str) -> list[list[Cell]]:
    """The rows of a table that hold data cells (a header row holds only ``th``)."""
    return [row for row in parsed.tables[table] if any(c.field for c in row)]


def cells(parsed: Page, table: str) -> list[Cell]:
    return list(chain.from_iterable(parsed.tables[table]))


def numbers(row: list[Cell]) -> dict[str, object]:
    return {c.field: json.loads(c.value) for c in row if c.field and c.value is not None}


def texts(row: list[Cell]) -> dict[str, str]:
    return {c.field: c.text for c in row if c.field}
