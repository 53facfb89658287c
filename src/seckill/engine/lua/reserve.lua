-- reserve.lua: decide one purchase, atomically.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  6 the buyer's idempotency record
--       7 the buyer's rate counter (read and written only when ARGV 7 sets a rate limit)
-- ARGV  1 item id  2 buyer  3 quantity  4 order id  5 idempotency record ttl (ms)
--       6 now (ms; "" = Redis TIME)  7 rate limit: attempts per window ("" or absent = none)
--       8 rate window (ms)  9 request id ("" or absent = none): carried on the `reserved` event
--       10 the idempotency key ("" or absent = none; KEYS 6 is its record): carried on the
--          `reserved` event, so that SQL can give a rebuilt Redis its records back
--
-- Rate limit: a fixed window per buyer and item that opens at the buyer's first counted attempt
--   (a hash {start, count} with a PEXPIRE of one window, so it goes away by itself). An attempt is
--   counted once the request is valid and is not answered from the idempotency record: a replay
--   is always answered, and an error has written nothing. A counted attempt writes the counter
--   even when it is then refused (sold out, limit, window): that is the one write a refusal
--   makes. An attempt over the limit is refused before it is counted and writes nothing at all.
--
-- Replies (only a reservation moves stock; a rejection did not, so a retry is decided afresh):
--   reserved            {reserved, order id, deadline ms}: available -q, held +q, buyer +q, hold
--                       recorded and indexed by deadline, `reserved` event appended, key recorded
--   replay              {replay, order id, deadline ms}: this key reserved before; nothing changed
--   key_reused          {key_reused, order id, deadline ms}: this key reserved another quantity
--   rate_limited        {rate_limited, retry after ms}: the buyer used up this window's attempts;
--                       nothing written (the window reopens after the time given)
--   sold_out            {sold_out}: nothing left
--   insufficient_stock  {insufficient_stock}: some left, less than asked
--   limit_reached       {limit_reached}: the buyer would pass the per-buyer limit
--   not_started         {not_started}
--   ended               {ended}
--   unknown_item        {unknown_item}: no such item loaded (not counted: there is no sale)
--   item_recovering     {item_recovering}: the shard is fenced (see live_run in _common.lua)
--                       until the reconciler has verified it against SQL; nothing written
-- Errors (nothing written):
--   invalid_item_id, invalid_buyer, invalid_quantity, invalid_order_id, invalid_ttl, invalid_time
--   invalid_rate_limit    attempts not 1 to 1000000, window not 1 ms to 30 days, or no key 7
--   invalid_request_id    not 1 to 64 visible ASCII characters
--   invalid_key           the idempotency key (ARGV 10) is not 1 to 255 visible ASCII characters
--   quantity_above_limit  more than the per-buyer limit in one request
--   duplicate_order_id    the order id already names a hold of this item

local item_id, buyer, quantity_arg, order_id, ttl_arg = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
-- A usual request passes the five rules below at once: one pattern match for its four numbers
-- (each match is a C call that costs more than the rest of a rule) and lengths that keep them in
-- range. Anything else is judged rule by rule, which names the argument at fault.
local usual = ttl_arg and #item_id < 19 and #quantity_arg < 7 and #order_id < 19 and #ttl_arg < 14
  and (item_id .. " " .. quantity_arg .. " " .. order_id .. " " .. ttl_arg):find(
    "^[1-9]%d* [1-9]%d* [1-9]%d* [1-9]%d*$")
  and is_token(buyer, 64)
if not usual then
  local refused = bad_item_id(item_id)
  if refused then return refused end
  if not is_token(buyer, 64) then
    return invalid("invalid_buyer", "buyer id must be 1 to 64 visible ASCII characters")
  end
  if not int_arg(quantity_arg, 1, MAX_QUANTITY) then
    return invalid("invalid_quantity", "quantity must be an integer from 1 to " .. MAX_QUANTITY)
  end
  refused = bad_order_id(order_id)
  if refused then return refused end
  if not int_arg(ttl_arg, 1, MAX_TIME) then
    return invalid("invalid_ttl", "idempotency ttl must be positive milliseconds")
  end
end
local quantity = tonumber(quantity_arg)
local now = now_arg(ARGV[6])
local refused = bad_time(now)
if refused then return refused end
local request_id = ARGV[9] or ""
if request_id ~= "" and not is_token(request_id, 64) then
  return invalid("invalid_request_id", "request id must be 1 to 64 visible ASCII characters")
end
local key = ARGV[10] or ""
if key ~= "" and not is_token(key, 255) then
  return invalid("invalid_key", "idempotency key must be 1 to 255 visible ASCII characters")
end
local rate_n, rate_ms = nil, nil
if (ARGV[7] or "") ~= "" then
  rate_n, rate_ms = int_arg(ARGV[7], 1, MAX_QUANTITY), int_arg(ARGV[8], 1, MAX_HOLD)
  if not (rate_n and rate_ms and KEYS[7]) then
    return invalid("invalid_rate_limit", "rate limit must be 1 to " .. MAX_QUANTITY
      .. " attempts per 1 to " .. MAX_HOLD .. " ms, with the buyer's rate key")
  end
end

local seen = redis.call("GET", KEYS[6])
if seen then
  local first = cjson.decode(seen)
  local code = first.quantity == quantity and "replay" or "key_reused"
  return { code, first.order_id, first.deadline_ms }
end

local f = redis.call("HMGET", K.item, "available", "held", "starts_at_ms", "ends_at_ms",
  "per_buyer_limit", "hold_ms", "run")
if not f[1] then return { "unknown_item" } end
local limit = tonumber(f[5])
if quantity > limit then
  return invalid("quantity_above_limit", "quantity " .. quantity .. " is above the per-buyer limit of " .. limit)
end
if redis.call("HEXISTS", K.holds, order_id) == 1 then
  return invalid("duplicate_order_id", "order " .. order_id .. " already exists")
end
if f[7] ~= live_run() then return { "item_recovering" } end

-- Everything is valid from here on, so counting the attempt is safe (see the header).
if rate_n then
  local r = redis.call("HMGET", KEYS[7], "start", "count")
  local start, count = tonumber(r[1]), tonumber(r[2])
  if start and count and now >= start and now < start + rate_ms then
    if count >= rate_n then return { "rate_limited", start + rate_ms - now } end
    redis.call("HINCRBY", KEYS[7], "count", 1)
  else
    -- A new window (also when the clock stepped back before the old one's start).
    redis.call("HSET", KEYS[7], "start", now, "count", 1)
    redis.call("PEXPIRE", KEYS[7], rate_ms)
  end
end

if now < tonumber(f[3]) then return { "not_started" } end
if now >= tonumber(f[4]) then return { "ended" } end
if (redis.call("HGET", K.buyers, buyer) or 0) + quantity > limit then
  return { "limit_reached" }
end
local available = tonumber(f[1])
if available <= 0 then return { "sold_out" } end
if available < quantity then return { "insufficient_stock" } end

-- Numbers go to Redis as strings: redis.call would print each with %.17g. Both records are JSON
-- written out by hand (see hold_json): cjson.encode costs more than the rest of this script's Lua.
local deadline = now + f[6]
local deadline_ms, at_ms = decimal(deadline), ARGV[6] ~= "" and ARGV[6] or decimal(now)
redis.call("HSET", K.item, "available", decimal(available - quantity), "held", decimal(f[2] + quantity))
redis.call("HINCRBY", K.buyers, buyer, quantity_arg)
redis.call("HSET", K.holds, order_id, hold_json(buyer, quantity_arg, deadline_ms, "held"))
redis.call("ZADD", K.deadlines, deadline_ms, order_id)
redis.call("XADD", K.events, "*", "event", "reserved", "item_id", item_id, "order_id", order_id,
  "buyer", buyer, "quantity", quantity_arg, "deadline_ms", deadline_ms, "at_ms", at_ms,
  "request_id", request_id, "key", key)
redis.call("SET", KEYS[6], '{"order_id":"' .. order_id .. '","quantity":' .. quantity_arg
  .. ',"deadline_ms":' .. deadline_ms .. "}", "PX", ttl_arg)
return { "reserved", order_id, deadline }
