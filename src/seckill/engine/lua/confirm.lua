-- confirm.lua: a payment succeeded: held -> paid.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events
-- ARGV  1 item id  2 order id  3 now (ms; "" = Redis TIME)
--
-- Replies:
--   paid           {paid}: held -q, sold +q, `paid` event appended
--   already_paid   {already_paid}: paid before; nothing changed
--   expired        {expired, reason}: released before the payment (the reason says why), or found
--                  past its deadline and released now as expired; never creates stock
--   unknown_order  {unknown_order}: no such hold; nothing changed
-- Errors (nothing written):
--   invalid_item_id, invalid_order_id, invalid_time

local item_id, order_id = ARGV[1], ARGV[2]
local now = now_arg(ARGV[3])
local refused = bad_item_id(item_id) or bad_order_id(order_id) or bad_time(now)
if refused then return refused end

local hold = load_hold(order_id)
if not hold then return { "unknown_order" } end
if hold.state == "paid" then return { "already_paid" } end
if hold.state == "released" then return { "expired", hold.reason } end
if now >= hold.deadline_ms then
  -- The deadline is the contract: a late payment does not revive the hold.
  release_hold(item_id, order_id, hold, "expired", now)
  return { "expired", "expired" }
end

local q = hold.quantity
redis.call("HINCRBY", K.item, "held", -q)
redis.call("HINCRBY", K.item, "sold", q)
redis.call("ZREM", K.deadlines, order_id)
hold.state = "paid"
save_hold(order_id, hold)
redis.call("XADD", K.events, "*", "event", "paid", "item_id", item_id, "order_id", order_id,
  "buyer", hold.buyer, "quantity", q, "at_ms", now)
return { "paid" }
