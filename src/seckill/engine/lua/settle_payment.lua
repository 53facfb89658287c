-- settle_payment.lua: a payment provider's notice, succeeded or failed, applied once per payment id.
--
-- A payment id names one payment of the notice's item: one charge (a sum in a currency) for one
-- order. Every success ends as exactly one of: the payment of its order (held -> paid), when it
-- is the order's sum (the item's unit price times the order's quantity, in the item's
-- currency); or a refund owed of the sum charged, journaled once.
--
-- This script runs on the order's stock shard, and records the answer in that shard's payments
-- hash. The item's head (shard 0) keeps every payment id the item has seen: an unsharded item's
-- records are all there; for an order on another shard, claim_payment.lua claims the id there
-- first, and the head's record then says on which shard the answer lives. An order no shard
-- holds is settled on the head.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  6 payments (this shard's: payment id
--       -> its answer, JSON {order_id, succeeded, amount, currency, outcome, reason}; on the
--       head, a claim made for another shard: {order_id, succeeded, amount, currency, shard})
-- ARGV  1 item id  2 order id  3 payment id  4 result (succeeded | failed)
--       5 amount charged (minor units)  6 its currency  7 now (ms; "" = Redis TIME)
--       8 the item's unit price (minor units)  9 the item's currency (both from SQL)
--       10 "0" if SQL does not hold the order under this item; "1" if it does (then no shard
--       holding it means Redis lost it, and recovery gives it back: nothing is owed yet); ""
--       not asked yet (a success no shard holds is then unknown_order, recorded nothing: the
--       caller asks SQL only then, and calls again)
--
-- Replies (each but a failure's unknown_order, replay, claimed and item_recovering is recorded
-- under the payment id, in this script):
--   paid              succeeded {paid}: held -q, sold +q, the hold keeps the payment id, `paid`
--                     event (with the payment id) appended
--   refund_required   succeeded {refund_required, reason}: a refund is owed for this payment,
--                     and a `refund_required` event (with the payment id, the reason and the
--                     sum charged) appended. The reason: currency_mismatch or amount_mismatch
--                     (not the order's sum: the order is left as it is, and may still be paid
--                     by the right sum); unknown_order (no shard holds the order: never issued,
--                     lost, or another item's; the event names no buyer or quantity); the
--                     release's (cancelled, expired, payment_failed: the hold was released
--                     before, or is found at or past its deadline and released now as expired;
--                     the first such payment marks the hold refund_required; stock never comes
--                     back); or duplicate_charge (another payment paid the order: it stays paid)
--   already_paid      failed {already_paid}: the order is paid; nothing changed
--   released          failed {released, payment_failed}: held -> released, as release.lua
--   already_released  failed {already_released, first reason}: released before; nothing changed
--   replay            {replay, outcome, reason if any}: this payment id was settled before, for
--                     this order, result and charge: the recorded answer; nothing changed
--   claimed           {claimed, shard}: (the head only) this payment id was claimed for this
--                     order, result and charge, to be settled on that shard; nothing changed
--   unknown_order     {unknown_order}: a failure for an order no shard holds, a success for one
--                     SQL holds (ARGV 10: Redis lost it) or may hold (""), or any notice for an
--                     item this shard does not hold (archived, or never loaded: SQL settles an
--                     archived item's); nothing changed, nothing recorded
--   item_recovering   {item_recovering}: the shard is fenced (see live_run in _common.lua)
--                     before the notice found its hold; nothing changed, nothing recorded (a
--                     notice answered before replays)
-- Errors (nothing written):
--   invalid_item_id, invalid_order_id, invalid_payment_id, invalid_payment_result,
--   invalid_amount, invalid_currency, invalid_time
--   invalid_price      the item's price or currency (ARGV 8, 9) is not one
--   payment_id_reused  the payment id was settled or claimed before for another order, result
--                      or charge

local item_id, order_id, payment_id = ARGV[1], ARGV[2], ARGV[3]
local refused, succeeded, amount, currency = notice_args()
if refused then return refused end
local now = now_arg(ARGV[7])
refused = bad_time(now)
if refused then return refused end
local price, item_currency = ARGV[8], ARGV[9]
if not (type(price) == "string" and #price <= 16 and price:find("^%d+$")
    and type(item_currency) == "string" and item_currency:find("^%u%u%u$")) then
  return invalid("invalid_price", "the item's price must be whole minor units, with its currency")
end

local first
first, refused = recorded_payment(KEYS[6], order_id, payment_id, succeeded, amount, currency)
if refused then return refused end
if first and first.shard then return { "claimed", first.shard } end
if first then return { "replay", first.outcome, first.reason } end

local hold = load_hold(order_id)
-- An item this shard does not hold (archived, or not put on sale) is not Redis's to settle.
if not hold and redis.call("EXISTS", K.item) == 0 then return { "unknown_order" } end
if fenced() then return { "item_recovering" } end
if not hold and (not succeeded or ARGV[10] ~= "0") then return { "unknown_order" } end

-- A refund owed of the sum charged for this payment, journaled once (the payment id is recorded
-- with it). An order nobody holds has no buyer or quantity to name.
local function refund(reason)
  if hold then
    redis.call("XADD", K.events, "*", "event", "refund_required", "item_id", item_id,
      "order_id", order_id, "buyer", hold.buyer, "quantity", hold.quantity, "reason", reason,
      "payment_id", payment_id, "amount", amount, "currency", currency, "at_ms", now)
  else
    redis.call("XADD", K.events, "*", "event", "refund_required", "item_id", item_id,
      "order_id", order_id, "reason", reason, "payment_id", payment_id, "amount", amount,
      "currency", currency, "at_ms", now)
  end
  return { "refund_required", reason }
end

-- Why this charge is not the order's sum, or nil when it is (the price is 16 digits at most and
-- the amount 15: a product too large for a double to hold exactly is above any amount).
local function wrong_sum()
  if currency ~= item_currency then return "currency_mismatch" end
  if tonumber(amount) ~= tonumber(price) * hold.quantity then return "amount_mismatch" end
end

-- A payment succeeded. The deadline is the contract, and money never brings stock back.
local function pay()
  if not hold then return refund("unknown_order") end
  local wrong = wrong_sum()
  if wrong then return refund(wrong) end
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
redis.call("HSET", KEYS[6], payment_id, cjson.encode({ order_id = order_id,
  succeeded = succeeded, amount = amount, currency = currency, outcome = reply[1],
  reason = reply[2] }))
return reply
