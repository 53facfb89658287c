-- settle_payment.lua: a payment provider's notice, succeeded or failed, applied once per payment id.
--
-- A payment id names one payment of the notice's item, and belongs to one order. Every success
-- ends as exactly one of: the payment of its order (held -> paid), or a refund owed for this
-- payment (the order was released first, or another payment paid it), journaled once.
--
-- This script runs on the order's stock shard, and records the answer in that shard's payments
-- hash. The item's head (shard 0) keeps every payment id the item has seen: an unsharded item's
-- records are all there; for an order on another shard, claim_payment.lua claims the id there
-- first, and the head's record then says on which shard the answer lives.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  6 payments (this shard's: payment id
--       -> its answer, JSON {order_id, succeeded, outcome, reason}; on the head, a claim made
--       for another shard: {order_id, succeeded, shard})
-- ARGV  1 item id  2 order id  3 payment id  4 result (succeeded | failed)
--       5 now (ms; "" = Redis TIME)
--
-- Replies (each but unknown_order, replay and claimed is recorded under the payment id, in this
-- script):
--   paid              succeeded {paid}: held -q, sold +q, the hold keeps the payment id, `paid`
--                     event (with the payment id) appended
--   refund_required   succeeded {refund_required, reason}: a refund is owed for this payment,
--                     and a `refund_required` event (with the payment id and the reason)
--                     appended. The reason is the release's (cancelled, expired, payment_failed:
--                     the hold was released before, or is found at or past its deadline and
--                     released now as expired; the first such payment marks the hold
--                     refund_required; stock never comes back) or duplicate_charge (another
--                     payment paid the order: it stays paid)
--   already_paid      failed {already_paid}: the order is paid; nothing changed
--   released          failed {released, payment_failed}: held -> released, as release.lua
--   already_released  failed {already_released, first reason}: released before; nothing changed
--   replay            {replay, outcome, reason if any}: this payment id was settled before, for
--                     this order and result: the recorded answer; nothing changed
--   claimed           {claimed, shard}: (the head only) this payment id was claimed for this
--                     order and result, to be settled on that shard; nothing changed
--   unknown_order     {unknown_order}: no such hold; nothing changed, nothing recorded
--   item_recovering   {item_recovering}: the shard is fenced (see live_run in _common.lua);
--                     nothing changed, nothing recorded (a notice answered before replays)
-- Errors (nothing written):
--   invalid_item_id, invalid_order_id, invalid_payment_id, invalid_payment_result, invalid_time
--   payment_id_reused  the payment id was settled or claimed before for another order or result

local item_id, order_id, payment_id = ARGV[1], ARGV[2], ARGV[3]
local refused, succeeded = notice_args()
if refused then return refused end
local now = now_arg(ARGV[5])
refused = bad_time(now)
if refused then return refused end

local first
first, refused = recorded_payment(KEYS[6], order_id, payment_id, succeeded)
if refused then return refused end
if first and first.shard then return { "claimed", first.shard } end
if first then return { "replay", first.outcome, first.reason } end

local hold = load_hold(order_id)
if not hold then return { "unknown_order" } end
if fenced() then return { "item_recovering" } end

-- A refund owed for this payment, journaled once (the payment id is recorded with it).
local function refund(reason)
  redis.call("XADD", K.events, "*", "event", "refund_required", "item_id", item_id,
    "order_id", order_id, "buyer", hold.buyer, "quantity", hold.quantity, "reason", reason,
    "payment_id", payment_id, "at_ms", now)
  return { "refund_required", reason }
end

-- A payment succeeded. The deadline is the contract, and money never brings stock back.
local function pay()
  if hold.state == "paid" then
    -- Its own payment, should the record be gone (a Redis rebuilt from SQL), pays it still.
    if hold.payment_id == payment_id then return { "paid" } end
    return refund("duplicate_charge")
  end
  if hold.state == "held" and now >= hold.deadline_ms then
    release_hold(item_id, order_id, hold, "expired", now)
  end
  if hold.state == "released" then
    if not hold.refund_required then
      hold.refund_required = true
      save_hold(order_id, hold)
    end
    return refund(hold.reason)
  end
  local q = hold.quantity
  redis.call("HINCRBY", K.item, "held", -q)
  redis.call("HINCRBY", K.item, "sold", q)
  redis.call("ZREM", K.deadlines, order_id)
  hold.state = "paid"
  hold.payment_id = payment_id
  save_hold(order_id, hold)
  redis.call("XADD", K.events, "*", "event", "paid", "item_id", item_id, "order_id", order_id,
    "buyer", hold.buyer, "quantity", q, "payment_id", payment_id, "at_ms", now)
  return { "paid" }
end

local function settle()
  if succeeded then return pay() end
  if hold.state == "paid" then return { "already_paid" } end
  if hold.state == "released" then return { "already_released", hold.reason } end
  release_hold(item_id, order_id, hold, "payment_failed", now)
  return { "released", "payment_failed" }
end

local reply = settle()
redis.call("HSET", KEYS[6], payment_id,
  cjson.encode({ order_id = order_id, succeeded = succeeded, outcome = reply[1], reason = reply[2] }))
return reply
