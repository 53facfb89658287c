-- settle_payment.lua: a payment provider's notice, succeeded or failed, applied once per payment id.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  6 payments (payment id -> its answer)
-- ARGV  1 item id  2 order id  3 payment id  4 result (succeeded | failed)
--       5 now (ms; "" = Redis TIME)
--
-- Replies (each but unknown_order and replay is recorded under the payment id, in this script):
--   paid              succeeded {paid}: held -> paid, as confirm.lua
--   refund_required   succeeded {refund_required, reason}: the hold was released, or is released
--                     now as expired; as confirm.lua (marked and journaled once)
--   already_paid      {already_paid}: paid before (a failure notice after a success changes
--                     nothing); nothing changed
--   released          failed {released, payment_failed}: held -> released, as release.lua
--   already_released  failed {already_released, first reason}: released before; nothing changed
--   replay            {replay, outcome, reason if any}: this payment id was settled before, for
--                     this order and result: the recorded answer; nothing changed
--   unknown_order     {unknown_order}: no such hold; nothing changed, nothing recorded
-- Errors (nothing written):
--   invalid_item_id, invalid_order_id, invalid_payment_id, invalid_payment_result, invalid_time
--   payment_id_reused  the payment id was settled before for another order or result

local item_id, order_id, payment_id, result = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local refused = bad_item_id(item_id) or bad_order_id(order_id)
if refused then return refused end
if not is_token(payment_id, 64) then
  return invalid("invalid_payment_id", "payment id must be 1 to 64 visible ASCII characters")
end
if result ~= "succeeded" and result ~= "failed" then
  return invalid("invalid_payment_result", "payment result must be succeeded or failed")
end
local now = now_arg(ARGV[5])
refused = bad_time(now)
if refused then return refused end
local succeeded = result == "succeeded"

local seen = redis.call("HGET", KEYS[6], payment_id)
if seen then
  local first = cjson.decode(seen)
  if first.order_id ~= order_id or first.succeeded ~= succeeded then
    return invalid("payment_id_reused", "payment " .. payment_id .. " was settled as "
      .. (first.succeeded and "succeeded" or "failed") .. " for order " .. first.order_id)
  end
  return { "replay", first.outcome, first.reason }
end

local hold = load_hold(order_id)
if not hold then return { "unknown_order" } end

local function settle()
  if succeeded then return pay_hold(item_id, order_id, hold, now) end
  if hold.state == "paid" then return { "already_paid" } end
  if hold.state == "released" then return { "already_released", hold.reason } end
  release_hold(item_id, order_id, hold, "payment_failed", now)
  return { "released", "payment_failed" }
end

local reply = settle()
redis.call("HSET", KEYS[6], payment_id,
  cjson.encode({ order_id = order_id, succeeded = succeeded, outcome = reply[1], reason = reply[2] }))
return reply
