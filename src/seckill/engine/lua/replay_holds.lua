-- replay_holds.lua: journal again the events that take each order from where SQL has it to
-- where its hold now stands, for SQL that lost them (an entry deleted before it landed). Redis
-- is not changed otherwise.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events
-- ARGV  1 item id  2 now (ms; "" = Redis TIME)
--       3.. pairs: order id, the order's status in SQL ("" when SQL has no such order)
--
-- Replies:
--   {order id, ...}  the orders whose events were appended (unknown ids skipped): reserved if
--                    SQL lacks the order, then paid (with its payment id) or released as the
--                    hold went and SQL did not. The ledger lands each once. Refunds owed are
--                    journaled again by payment id (replay_refunds.lua).
-- Errors (nothing written):
--   invalid_item_id, invalid_time, invalid_order_id, invalid_batch

local item_id = ARGV[1]
local now = now_arg(ARGV[2])
local refused = bad_item_id(item_id) or bad_time(now)
if refused then return refused end
if #ARGV % 2 ~= 0 or (#ARGV - 2) / 2 > MAX_BATCH then
  return invalid("invalid_batch", "order id and SQL status pairs, at most " .. MAX_BATCH)
end
for i = 3, #ARGV, 2 do
  refused = bad_order_id(ARGV[i])
  if refused then return refused end
end

local function journal(kind, order_id, hold, extra)
  local fields = { "event", kind, "item_id", item_id, "order_id", order_id, "buyer", hold.buyer,
    "quantity", hold.quantity, "at_ms", now, "replayed", "1" }
  for _, v in ipairs(extra) do fields[#fields + 1] = v end
  redis.call("XADD", K.events, "*", unpack(fields))
end

local replayed = {}
for i = 3, #ARGV, 2 do
  local order_id, in_sql = ARGV[i], ARGV[i + 1]
  local hold = load_hold(order_id)
  if hold then
    if in_sql == "" then
      journal("reserved", order_id, hold, { "deadline_ms", hold.deadline_ms })
    end
    if hold.state == "paid" and in_sql ~= "paid" then
      journal("paid", order_id, hold, hold.payment_id and { "payment_id", hold.payment_id } or {})
    elseif hold.state == "released" and in_sql ~= "released" and in_sql ~= "refund_required" then
      journal("released", order_id, hold, { "reason", hold.reason })
    end
    replayed[#replayed + 1] = order_id
  end
end
return replayed
