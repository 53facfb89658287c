"""Sinks: where order events go after Redis, for the shop's other systems to follow.

A sink is a broker behind one small protocol (:class:`Sink`): ``open()``, ``publish(batch)``
that returns only once the broker confirmed every message, and ``close()``. A caller reading a
stream through its own consumer group acknowledges an entry only after its message was
confirmed; a redelivered entry gives the same message id, so the broker or its consumers drop
the copy. Two adapters: RabbitMQ (``seckill.sinks.rabbitmq``) and NATS JetStream
(``seckill.sinks.nats``), chosen by URL with :func:`sink_from_url`. Every message carries the
same versioned JSON body (``seckill.sinks.messages``).
"""

from seckill.sinks.base import (
    Sink,
    SinkError,
    SinkRefused,
    SinkUnavailable,
    bridge_group,
)
from seckill.sinks.by_url import sink_from_url
from seckill.sinks.messages import Message, OrderEventBody, body_schema, order_message

__all__ = [
    "Message",
    "OrderEventBody",
    "Sink",
    "SinkError",
    "SinkRefused",
    "SinkUnavailable",
    "body_schema",
    "bridge_group",
    "order_message",
    "sink_from_url",
]
