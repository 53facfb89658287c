"""The choice of an adapter by URL. Apart from the protocol (``base``), which the adapters
import: this module imports them, lazily, so one broker's client never loads the other's."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from seckill.sinks.base import Sink, redact_url

RABBITMQ_SCHEMES = frozenset({"amqp", "amqps"})
NATS_SCHEMES = frozenset({"nats", "tls"})


def sink_from_url(url: str, **options: Any) -> Sink:
    """The sink a URL names: ``amqp://`` or ``amqps://`` RabbitMQ, ``nats://`` or ``tls://``
    NATS JetStream. ``options`` go to the adapter's constructor. Nothing connects yet."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in RABBITMQ_SCHEMES:
        from seckill.sinks.rabbitmq import RabbitMQSink

        return RabbitMQSink(url, **options)
    if scheme in NATS_SCHEMES:
        from seckill.sinks.nats import NatsSink

        return NatsSink(url, **options)
    known = ", ".join(f"{s}://" for s in sorted(RABBITMQ_SCHEMES | NATS_SCHEMES))
    raise ValueError(f"no sink for {redact_url(url)!r}: the URL must start with one of {known}")
