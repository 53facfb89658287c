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
--   item_recovering   {item_recovering}: the shard is fenced (see live_run in _common.lua);
--                     nothing changed
-- Errors (nothing written):
--   invalid_item_id, invalid_order_id, invalid_reason, invalid_time

local item_id, order_id, reason = ARGV[1], ARGV[2], ARGV[3]
local now = now_arg(ARGV[4])
local refused = bad_item_id(item_id) or bad_order_id(order_id) or bad_time(now)
if refused then return refused end
if not RELEASE_REASONS[reason] then
  return invalid("invalid_reason", "reason must be cancelled, expired or payment_failed")
end

local hold = load_hold(order_id)
if not hold then return { "unknown_order" } end
if hold.state == "paid" then return { "already_paid" } end
if hold.state == "released" then return { "already_released", hold.reason } end
if fenced() then return { "item_recovering" } end
release_hold(item_id, order_id, hold, reason, now)
return { "released", reason }
