-- confirm.lua: a payment succeeded: held -> paid, or a refund if the hold is gone.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events
-- ARGV  1 item id  2 order id  3 now (ms; "" = Redis TIME)
--
-- Replies (decided by pay_hold, shared with settle_payment.lua):
--   paid             {paid}: held -q, sold +q, `paid` event appended
--   already_paid     {already_paid}: paid before; nothing changed
--   refund_required  {refund_required, reason}: the hold was released before the payment (the
--                    reason says why), or is found at or past its deadline and released now as
--                    expired (`released` event). Stock never comes back: the money must. The
--                    first time, the hold is marked refund_required and a `refund_required`
--                    event appended; later payments change nothing
--   unknown_order    {unknown_order}: no such hold; nothing changed
-- Errors (nothing written):
--   invalid_item_id, invalid_order_id, invalid_time

local item_id, order_id = ARGV[1], ARGV[2]
local now = now_arg(ARGV[3])
local refused = bad_item_id(item_id) or bad_order_id(order_id) or bad_time(now)
if refused then return refused end

local hold = load_hold(order_id)
if not hold then return { "unknown_order" } end
return pay_hold(item_id, order_id, hold, now)
