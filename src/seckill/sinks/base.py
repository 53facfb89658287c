"""The sink protocol and what its failures mean."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from seckill.domain.masking import mask_url
from seckill.sinks.messages import Message

CONNECT_TIMEOUT_S = 5.0
"""How long connecting and declaring the topology may take before the broker counts as down."""

CONFIRM_TIMEOUT_S = 10.0
"""How long a batch may wait for its confirms. Longer than a broker's usual pause (a quorum
queue's or a stream's disk sync under load), short enough that the caller soon backs off."""


class SinkError(Exception):
    """A publish the broker did not confirm in full."""


class SinkUnavailable(SinkError):
    """The broker could not be reached, lost the connection, did not confirm in time, or had
    nowhere to put the messages (no queue bound, no stream for the subject).

    Nothing of the batch may be assumed delivered: publish all of it again later (the message
    ids let the broker or its consumers drop what did arrive). The sink reconnects, and declares
    its topology again, on the next publish."""


class SinkRefused(SinkError):
    """The broker answered, and refused some messages (a nack, a full stream); every other
    message of the batch is confirmed."""

    def __init__(self, refused: Mapping[str, str]) -> None:
        self.refused = dict(refused)  # message id -> the broker's reason
        shown = ", ".join(f"{mid}: {why}" for mid, why in list(self.refused.items())[:3])
        more = f" and {len(self.refused) - 3} more" if len(self.refused) > 3 else ""
        super().__init__(f"the broker refused {len(self.refused)} message(s): {shown}{more}")

    @property
    def message_ids(self) -> frozenset[str]:
        """The ids to publish again, and after enough refusals to dead-letter."""
        return frozenset(self.refused)


class Sink(Protocol):
    """Where order events go after Redis: a broker that confirms what it stored."""

    @property
    def name(self) -> str:
        """Short and fixed ("rabbitmq", "nats"): a metric label, a log field."""
        ...

    async def open(self) -> None:
        """Connect and declare what the messages need (exchange and queue, or stream).

        Raises :class:`SinkUnavailable` when that cannot be done."""
        ...

    async def publish(self, messages: Sequence[Message]) -> None:
        """Return once the broker confirmed every message.

        The messages reach the broker in the batch's order. Opens the sink first if it is not
        open (again, after a failure). Raises :class:`SinkUnavailable` (publish the whole batch
        again later) or :class:`SinkRefused` (the others are confirmed). One batch at a time:
        await each publish before the next."""
        ...

    async def close(self) -> None:
        """Let go of the connection; safe to call twice, and on a sink never opened."""
        ...


async def publish_in_order(
    messages: Sequence[Message],
    publish: Callable[[Message], Awaitable[object]],
    *,
    broker: str,
    timeout_s: float,
    lost: tuple[type[BaseException], ...],
    refusal: Callable[[BaseException], str | None],
) -> None:
    """Publish a batch, every message at once, and say what the broker made of it.

    ``publish`` sends one message and waits for its confirm. One task per message, started in
    the batch's order: each client writes a message before it first waits (aio-pika under the
    channel's first-come, first-served lock; nats-py to its write buffer), so the broker gets
    the batch in order (reserved before paid), and the confirms come back together, one round
    trip for the batch. The contract suite checks the order.

    ``lost``: what the client raises when a message's fate is unknown (a lost connection).
    ``refusal``: the broker's reason when it refused a message, else ``None``. Returns once
    every message is confirmed; raises :class:`SinkUnavailable` if any fate is unknown (a
    timeout counts), else :class:`SinkRefused` with the refused ids."""
    try:
        async with asyncio.timeout(timeout_s):
            outcomes = await asyncio.gather(*map(publish, messages), return_exceptions=True)
    except TimeoutError:
        raise SinkUnavailable(
            f"{broker}: a batch of {len(messages)} not confirmed within {timeout_s} s"
        ) from None
    refused: dict[str, str] = {}
    for message, outcome in zip(messages, outcomes, strict=True):
        if not isinstance(outcome, BaseException):
            continue
        reason = refusal(outcome)
        if reason is not None:
            refused[message.message_id] = reason
        elif isinstance(outcome, (*lost, asyncio.CancelledError)):
            raise SinkUnavailable(f"{broker}: {outcome!r}") from outcome
        else:
            raise outcome
    if refused:
        raise SinkRefused(refused)


def bridge_group(sink: str) -> str:
    """The consumer group of the bridge to ``sink`` on every item stream (``bridge-rabbitmq``):
    one per sink, beside the persister's, each with its own progress."""
    return f"bridge-{sink}"


def redact_url(url: str) -> str:
    """The URL without its credentials, for messages and logs (the one rule: ``mask_url``)."""
    return mask_url(url)
