-- replay_refunds.lua: journal again the refunds owed that SQL lost (an entry deleted before it
-- landed), each from its payment's record and its order's hold. Redis is not changed otherwise.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  6 payments (this shard's)
-- ARGV  1 item id  2 now (ms; "" = Redis TIME)  3.. payment ids
--
-- Replies:
--   {payment id, ...}  the payments whose `refund_required` event was appended: those recorded
--                      here as a refund owed for an order this shard holds (others skipped).
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
  local hold = record and record.outcome == "refund_required" and load_hold(record.order_id)
  if hold then
    redis.call("XADD", K.events, "*", "event", "refund_required", "item_id", item_id,
      "order_id", record.order_id, "buyer", hold.buyer, "quantity", hold.quantity,
      "reason", record.reason, "payment_id", ARGV[i], "at_ms", now, "replayed", "1")
    replayed[#replayed + 1] = ARGV[i]
  end
end
return replayed
