"""The archiver: each pass, archives the items whose sale ended a grace period ago and that
are settled (see ``seckill.services.archive``), and finishes the removal of items archived in
SQL whose keys Redis still holds (a crash between the two steps).

It looks only at items still in the registry whose end time has passed, in one SQL query: an
unsettled item is looked at again next pass, and the registry shrinks as items are archived.
Any number may run side by side: each item is archived under its own upkeep lease.
"""

from __future__ import annotations

import logging

from seckill.domain.lifecycle import Unsettled, described
from seckill.observability import metrics
from seckill.services.archive import Archivist

log = logging.getLogger(__name__)


class Archiver:
    name = "archiver"

    def __init__(self, *, archivist: Archivist) -> None:
        self._archivist = archivist
        self.archived = 0

    async def run_once(self) -> int:
        """One pass; returns how many items left Redis."""
        removed = 0
        for item_id in await self._archivist.due():
            done = await self._archivist.archive(item_id)
            if done.removed:
                removed += 1
                log.info("item %d archived: its keys left Redis; SQL answers for it", item_id)
            elif any(h.reason is not Unsettled.IN_GRACE for h in done.hindrances):
                log.info("item %d not archived yet: %s", item_id, described(done.hindrances))
        self.archived += removed
        metrics.ITEMS_ARCHIVED.inc(removed)
        return 0  # the loop waits one interval either way
