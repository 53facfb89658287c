"""Logs: plain text for a terminal or one JSON object per line, each with the request id.

The API gives every request an id (the caller's ``X-Request-Id`` when it is usable, else a new
one) and keeps it in a context variable for the request's whole task; every log line written
meanwhile carries it. The purchase path hands it to the reserve script, which puts it on the
``reserved`` event; the persister lands it in the order's SQL row (``orders.request_id``) and
logs with it. So one id follows a purchase from the API through the stream to the SQL row.
"""

from __future__ import annotations

import json
import logging
import random
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="")
# Attributes a log call may pass in ``extra`` that JSON lines show as fields of their own.
FIELDS = ("request_id", "item_id", "order_id", "buyer")
_STANDARD = set(vars(logging.makeLogRecord({})))


def new_request_id() -> str:
    # 16 hex characters. Not a secret, only unique enough to find a request's lines: the fast
    # generator (secrets' reads the OS's entropy on every call, 7% of a purchase).
    return f"{random.getrandbits(64):016x}"


class RequestIdFilter(logging.Filter):
    """Stamps each record with the current request id, unless the call gave its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", ""):
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the known fields set."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value not in (None, ""):
                line[name] = value
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", "")
        return f"{text} [request {request_id}]" if request_id else text


def configure_logging(fmt: Literal["text", "json"] = "text", level: str = "INFO") -> None:
    """Route every logger to stderr in ``fmt``, request ids included."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # No line shows where a call was made from, nor its thread or process: not gathering them
    # (the logging HOWTO's "Optimization") takes a fifth off each line, one per purchase held.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
