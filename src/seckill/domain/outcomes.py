"""Every answer the engine gives, named once.

The values are the exact words the Lua scripts reply with; a test parses the scripts' headers
and checks both tables agree.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """A decided answer: the script ran and its reply says what happened."""

    # load_item
    LOADED = "loaded"
    RELOADED = "reloaded"
    # reserve
    RESERVED = "reserved"
    REPLAY = "replay"
    KEY_REUSED = "key_reused"
    RATE_LIMITED = "rate_limited"
    SOLD_OUT = "sold_out"
    INSUFFICIENT_STOCK = "insufficient_stock"
    LIMIT_REACHED = "limit_reached"
    NOT_STARTED = "not_started"
    ENDED = "ended"
    UNKNOWN_ITEM = "unknown_item"
    # release / settle_payment / claim_payment
    PAID = "paid"
    ALREADY_PAID = "already_paid"
    REFUND_REQUIRED = "refund_required"
    RELEASED = "released"
    ALREADY_RELEASED = "already_released"
    UNKNOWN_ORDER = "unknown_order"
    # a stock shard fenced after Redis lost writes, or restarted: it sells nothing until verified
    ITEM_RECOVERING = "item_recovering"
    CLAIMED = "claimed"  # a payment id claimed on the item's head, for an order on another shard
    # transfer_out / transfer_in (stock moving between an item's shards)
    TRANSFERRED = "transferred"
    # recount / recover (the reconciler's repairs)
    RECOUNTED = "recounted"
    RECOVERED = "recovered"
    PLANNED = "planned"
    # queue_join / queue_place / queue_advance (the waiting room)
    QUEUED = "queued"
    ALREADY_QUEUED = "already_queued"
    PLACED = "placed"
    NOT_QUEUED = "not_queued"
    ADVANCED = "advanced"
    # fence (a shard fenced, or verified again)
    FENCED = "fenced"
    VERIFIED = "verified"
    MOVED = "moved"
    # archive (an item leaving Redis once settled)
    ARCHIVED = "archived"
    UNSETTLED = "unsettled"


class ErrorCode(StrEnum):
    """Why a request was refused as invalid. A refused request has written nothing."""

    INVALID_ITEM_ID = "invalid_item_id"
    INVALID_ITEM = "invalid_item"
    INVALID_BUYER = "invalid_buyer"
    INVALID_KEY = "invalid_key"
    INVALID_QUANTITY = "invalid_quantity"
    QUANTITY_ABOVE_LIMIT = "quantity_above_limit"
    INVALID_ORDER_ID = "invalid_order_id"
    DUPLICATE_ORDER_ID = "duplicate_order_id"
    INVALID_REASON = "invalid_reason"
    INVALID_TIME = "invalid_time"
    INVALID_BATCH = "invalid_batch"
    INVALID_TTL = "invalid_ttl"
    INVALID_RATE_LIMIT = "invalid_rate_limit"
    INVALID_REQUEST_ID = "invalid_request_id"
    ITEM_ACTIVE = "item_active"
    TOTAL_BELOW_COMMITTED = "total_below_committed"
    LIMIT_BELOW_COMMITTED = "limit_below_committed"
    INVALID_PAYMENT_ID = "invalid_payment_id"
    INVALID_PAYMENT_RESULT = "invalid_payment_result"
    INVALID_AMOUNT = "invalid_amount"
    INVALID_CURRENCY = "invalid_currency"
    INVALID_PRICE = "invalid_price"
    PAYMENT_ID_REUSED = "payment_id_reused"
    INVALID_SHARD = "invalid_shard"
    INVALID_FENCE = "invalid_fence"
    HOLDS_EXCEED_TOTAL = "holds_exceed_total"
    INVALID_RECOVERY = "invalid_recovery"
    INVALID_TRANSFER = "invalid_transfer"
    STOCK_SHARDS_FIXED = "stock_shards_fixed"
    INVALID_DRAW = "invalid_draw"
    INVALID_ADMISSION = "invalid_admission"
    ITEM_ARCHIVED = "item_archived"
    ITEM_UNSETTLED = "item_unsettled"
    SALE_NOT_STARTED = "sale_not_started"
    INVALID_GROUP = "invalid_group"


class ApiRefusal(StrEnum):
    """The API's own refusal codes, beside the engine's (``Outcome``, ``ErrorCode``): a request
    it could not read, credentials it refused, an outage. Listed once; ``api/errors.py`` gives
    each its status."""

    INVALID_REQUEST = "invalid_request"
    BODY_TOO_LARGE = "body_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    IDEMPOTENCY_KEY_REQUIRED = "idempotency_key_required"
    NO_WAITING_ROOM = "no_waiting_room"
    UNKNOWN_REFUND = "unknown_refund"
    ORDER_LOST = "order_lost"
    REQUEST_IN_FLIGHT = "request_in_flight"
    INVALID_TOKEN = "invalid_token"
    FORBIDDEN = "forbidden"
    INVALID_SIGNATURE = "invalid_signature"
    INVALID_TICKET = "invalid_ticket"
    INVALID_PASS = "invalid_pass"
    GATE_REFUSED = "gate_refused"
    OVERLOADED = "overloaded"
    REDIS_UNAVAILABLE = "redis_unavailable"
    NOT_DURABLE = "not_durable"
    DATABASE_UNAVAILABLE = "database_unavailable"
    DATABASE_BUSY = "database_busy"
    INTERNAL_ERROR = "internal_error"


class InvalidRequest(ValueError):
    """Bad input, refused before any write (by Python first, by the script as a last guard)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
