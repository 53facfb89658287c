"""How long a page of an operator's list may be, stated once for every list that pages (items,
refunds owed, dead letters): newest first, ``limit`` entries at most, and the cursor of the next
(older) page, or None at the end."""

from __future__ import annotations

DEFAULT_PAGE = 50
MAX_PAGE = 500


def page_size(limit: int) -> int:
    """``limit`` held to 1..MAX_PAGE (the API refuses anything else before it gets here)."""
    return max(1, min(limit, MAX_PAGE))
