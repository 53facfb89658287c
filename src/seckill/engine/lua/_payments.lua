-- _payments.lua: a payment notice's arguments and what its payment id recorded, placed after
-- _common.lua before the scripts that take a notice (scripts.PAYMENT_SCRIPTS); no contract of
-- its own.

-- ARGV 1 item id  2 order id  3 payment id  4 result (succeeded | failed): the refusal, or nil
-- and whether the payment succeeded.
local function notice_args()
  local refused = bad_item_id(ARGV[1]) or bad_order_id(ARGV[2])
  if refused then return refused end
  if not is_token(ARGV[3], 64) then
    return invalid("invalid_payment_id", "payment id must be 1 to 64 visible ASCII characters")
  end
  if ARGV[4] ~= "succeeded" and ARGV[4] ~= "failed" then
    return invalid("invalid_payment_result", "payment result must be succeeded or failed")
  end
  return nil, ARGV[4] == "succeeded"
end

-- The record a payments hash keeps under the notice's payment id: nil when there is none, else
-- the record if it is this order's and result's, or nil and the refusal (payment_id_reused): a
-- payment id belongs to one order, with one result.
local function recorded_payment(payments, order_id, payment_id, succeeded)
  local seen = redis.call("HGET", payments, payment_id)
  if not seen then return nil end
  local first = cjson.decode(seen)
  if first.order_id ~= order_id or first.succeeded ~= succeeded then
    return nil, invalid("payment_id_reused", "payment " .. payment_id .. " was settled as "
      .. (first.succeeded and "succeeded" or "failed") .. " for order " .. first.order_id)
  end
  return first
end
