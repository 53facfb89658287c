-- replay_refunds.lua: journal again the refunds owed that SQL lost (an entry deleted before it
-- landed), each from its payment's record (with the sum charged, when it kept one) and its
-- order's hold (none for an unknown_order refund). Redis is not changed otherwise.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  6 payments (this shard's)
-- ARGV  1 item id  2 now (ms; "" = Redis TIME)  3.. payment ids
--
-- Replies:
--   {payment id, ...}  the payments whose `refund_required` event was appended: those recorded
--                      here as a refund owed for an order this shard holds, or for an order
--                      nobody knows (others skipped).
--                      The ledger lands each refund once.
-- Errors (nothing written):
--   invalid_item_id, invalid_time, invalid_payment_id, invalid_batch

local item_id = ARGV[1]
local now = now_arg(ARGV[2])
local refused = bad_item_id(item_id) or bad_time(now)
if refused then return refused end
if #ARGV - 2 > MAX_BATCH then
  return invalid("invalid_batch", "at most " .. MAX_BATCH .. " payment ids")
end
for i = 3, #ARGV do
  if not is_token(ARGV[i], 64) then
    return invalid("invalid_payment_id", "payment id must be 1 to 64 visible ASCII characters")
  end
end

local replayed = {}
for i = 3, #ARGV do
  local raw = redis.call("HGET", KEYS[6], ARGV[i])
  local record = raw and cjson.decode(raw)
  local owed = record and record.outcome == "refund_required"
  local hold = owed and load_hold(record.order_id)
  if hold or (owed and record.reason == "unknown_order") then
    local fields = { "event", "refund_required", "item_id", item_id, "order_id",
      record.order_id, "reason", record.reason, "payment_id", ARGV[i], "at_ms", now,
      "replayed", "1" }
    if hold then
      table.insert(fields, "buyer"); table.insert(fields, hold.buyer)
      table.insert(fields, "quantity"); table.insert(fields, hold.quantity)
    end
    if record.amount then
      table.insert(fields, "amount"); table.insert(fields, record.amount)
      table.insert(fields, "currency"); table.insert(fields, record.currency)
    end
    redis.call("XADD", K.events, "*", unpack(fields))
    replayed[#replayed + 1] = ARGV[i]
  end
end
return replayed
