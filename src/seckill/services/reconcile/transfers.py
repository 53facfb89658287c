"""Transfers between the stock shards of one item, checked across its shards: a shard whose
Redis went back (an older AOF, a lagging replica promoted: it is fenced) may have lost one half
of a transfer that the other shard, on another server, kept.

A transfer is two scripts on two shards (transfer_out.lua, then transfer_in.lua): the sender's
``out:<id>`` record and its in-transit index entry are written together, the receiver's
``in:<id>`` record next, and the sender's index entry is dropped once the receiver has it. So:

- **a receipt lost**: the sender has ``out:<id>`` to the fenced shard, no longer in transit,
  and the fenced shard has no ``in:<id>``. The units left the sender and are on no shard now:
  nobody can buy them (an undersell), and nothing would deliver them again.
- **a sending lost**: a shard has ``in:<id>`` from the fenced shard, which has no
  ``out:<id>``. The fenced shard counts the units again beside the receiver (an oversell).

Both are read without a race: a fenced shard takes no transfer in or out until it is verified,
and a shard receives from a sender only what that sender recorded as sent. Either is
``transfer_lost``, writes Redis lost: the item is rebuilt from SQL, which sets the shards'
totals so that they add up to the item's (``recovery``).
"""

from __future__ import annotations

from collections.abc import Sequence

from seckill.engine.reads import ItemSnapshot
from seckill.services.reconcile.drift import Drift, Finding


def transfer_findings(snapshots: Sequence[ItemSnapshot]) -> list[Finding]:
    """The halves of transfers a fenced shard of the item lost (see the module's docstring);
    ``snapshots``: one per shard of the item, each read at one instant."""
    fenced = {s.shard for s in snapshots if s.fenced}
    if not fenced:
        return []
    records = {s.shard: s.transfers for s in snapshots}
    findings = []
    for snapshot in snapshots:
        for name, record in snapshot.transfers.items():
            side, _, transfer_id = name.partition(":")
            if side == "out" and record["to"] in fenced:
                receiver = records.get(record["to"], {})
                if f"in:{transfer_id}" not in receiver and transfer_id not in snapshot.in_transit:
                    findings.append(_lost(snapshot.shard, record["to"], transfer_id, record))
            elif side == "in" and record["from"] in fenced:
                sender = records.get(record["from"], {})
                if f"out:{transfer_id}" not in sender:
                    findings.append(_lost(record["from"], snapshot.shard, transfer_id, record))
    return findings


def _lost(sender: int, receiver: int, transfer_id: str, record: dict[str, int]) -> Finding:
    units = record["units"]
    kept, lost = ("sent", "received") if "to" in record else ("received", "sent")
    return Finding(
        Drift.TRANSFER_LOST,
        f"transfer {transfer_id}",
        f"{kept} ({units} units, shard {sender} to {receiver})",
        "-",
        f"shard {receiver if lost == 'received' else sender} lost its half: never {lost} "
        "there, as Redis now has it",
        shard=receiver if lost == "received" else sender,
    )
