-- release.lua: give a hold's stock back (cancelled, expired or payment failed): held -> released.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events
-- ARGV  1 item id  2 order id  3 reason (cancelled | expired | payment_failed)
--       4 now (ms; "" = Redis TIME)
--
-- Replies:
--   released          {released, reason}: held -q, available +q, buyer -q, `released` event appended
--   already_released  {already_released, first reason}: released before; nothing changed
--   already_paid      {already_paid}: refused, a paid hold keeps its stock; nothing changed
--   unknown_order     {unknown_order}: no such hold; nothing changed
-- Errors (nothing written):
--   invalid_item_id, invalid_order_id, invalid_reason, invalid_time

local item_id, order_id, reason = ARGV[1], ARGV[2], ARGV[3]
if not is_id(item_id) then
  return invalid("invalid_item_id", "item id must be an integer from 1 to 2^63-1")
end
if not is_id(order_id) then
  return invalid("invalid_order_id", "order id must be an integer from 1 to 2^63-1")
end
if not RELEASE_REASONS[reason] then
  return invalid("invalid_reason", "reason must be cancelled, expired or payment_failed")
end
local now = now_arg(ARGV[4])
if not now then return invalid("invalid_time", "time must be positive epoch milliseconds") end

local hold = load_hold(order_id)
if not hold then return { "unknown_order" } end
if hold.state == "paid" then return { "already_paid" } end
if hold.state == "released" then return { "already_released", hold.reason } end
release_hold(item_id, order_id, hold, reason, now)
return { "released", reason }
