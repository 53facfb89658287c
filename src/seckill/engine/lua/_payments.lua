-- _payments.lua: a payment notice's arguments and what its payment id recorded, placed after
-- _common.lua before the scripts that take a notice (scripts.PAYMENT_SCRIPTS); no contract of
-- its own.

local MAX_AMOUNT = 999999999999999 -- minor units: 15 digits (rules.MAX_AMOUNT)

-- ARGV 1 item id  2 order id  3 payment id  4 result (succeeded | failed)  5 amount charged
-- (minor units)  6 its currency (ISO 4217): the refusal, or nil, whether the payment
-- succeeded, and the charge (amount as a canonical decimal string, currency).
local function notice_args()
  local refused = bad_item_id(ARGV[1]) or bad_order_id(ARGV[2])
  if refused then return refused end
  if not is_token(ARGV[3], 64) then
    return invalid("invalid_payment_id", "payment id must be 1 to 64 visible ASCII characters")
  end
  if ARGV[4] ~= "succeeded" and ARGV[4] ~= "failed" then
    return invalid("invalid_payment_result", "payment result must be succeeded or failed")
  end
  if not int_arg(ARGV[5], 0, MAX_AMOUNT) then
    return invalid("invalid_amount", "amount must be an integer from 0 to " .. MAX_AMOUNT
      .. " (minor units of the currency)")
  end
  if not (type(ARGV[6]) == "string" and ARGV[6]:find("^%u%u%u$")) then
    return invalid("invalid_currency", "currency must be an ISO 4217 code: three capital letters")
  end
  return nil, ARGV[4] == "succeeded", ARGV[5], ARGV[6]
end

-- The record a payments hash keeps under the notice's payment id: nil when there is none, else
-- the record if it is this order's, result's and charge's, or nil and the refusal
-- (payment_id_reused): a payment id is one charge, of one order, with one result. A record
-- given back from SQL (recovery) may carry no charge: the order and result decide then.
local function recorded_payment(payments, order_id, payment_id, succeeded, amount, currency)
  local seen = redis.call("HGET", payments, payment_id)
  if not seen then return nil end
  local first = cjson.decode(seen)
  if first.order_id ~= order_id or first.succeeded ~= succeeded
      or (first.amount and (first.amount ~= amount or first.currency ~= currency)) then
    local charge = first.amount and (" (" .. first.amount .. " " .. first.currency .. ")") or ""
    return nil, invalid("payment_id_reused", "payment " .. payment_id .. " was settled as "
      .. (first.succeeded and "succeeded" or "failed") .. charge .. " for order "
      .. first.order_id)
  end
  return first
end
