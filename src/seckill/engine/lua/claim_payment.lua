-- claim_payment.lua: claim a payment id, on the item's head (shard 0), for an order on another
-- stock shard, before settle_payment.lua settles the notice there.
--
-- A payment id belongs to one order of its item, whatever the shards: the head keeps every id
-- the item has seen, so two notices with one id for orders on two shards cannot both pass, even
-- at the same moment (this script runs alone). A notice whose settling never ran after its claim
-- (its process stopped in between) is settled by the provider's retry, which this script lets
-- through again, or by the reconciler.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events (the head's; not read)
--       6 payments (the head's)
-- ARGV  1 item id  2 order id  3 payment id  4 result (succeeded | failed)  5 amount charged
--       (minor units)  6 its currency  7 the order's shard
--
-- Replies:
--   claimed          {claimed, shard}: the id is this order's, result's and charge's, settled
--                    on that shard
--                    (its record was written now, or before by this same notice; 0: the head
--                    settled it)
--   item_recovering  {item_recovering}: the head is fenced (see live_run in _common.lua) and
--                    the id was not claimed before; nothing written
-- Errors (nothing written):
--   invalid_item_id, invalid_order_id, invalid_payment_id, invalid_payment_result,
--   invalid_amount, invalid_currency
--   invalid_shard      the shard is not a number from 1 to 63
--   payment_id_reused  the payment id was settled or claimed before for another order, result
--                      or charge

local order_id, payment_id = ARGV[2], ARGV[3]
local refused, succeeded, amount, currency = notice_args()
if refused then return refused end
local shard = int_arg(ARGV[7], 1, 63)
if not shard then return invalid("invalid_shard", "the order's shard must be from 1 to 63") end

local first
first, refused = recorded_payment(KEYS[6], order_id, payment_id, succeeded, amount, currency)
if refused then return refused end
if first then return { "claimed", first.shard or 0 } end
if fenced() then return { "item_recovering" } end
redis.call("HSET", KEYS[6], payment_id,
  cjson.encode({ order_id = order_id, succeeded = succeeded, amount = amount,
    currency = currency, shard = shard }))
return { "claimed", shard }
