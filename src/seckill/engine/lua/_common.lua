-- _common.lua: helpers that scripts.py places before every script; no contract of its own.
-- The input rules mirror seckill/domain/rules.py; a test feeds both the same inputs.

local MAX_ID = "9223372036854775807"
local MAX_QUANTITY = 1000000
local MAX_TOTAL = 1000000000000
local MAX_TIME = 90000000000000 -- time + hold stays within cjson's 14 significant digits
local MAX_HOLD = 2592000000
local MAX_BATCH = 10000
local RELEASE_REASONS = { cancelled = true, expired = true, payment_failed = true }

local function invalid(code, message)
  return redis.error_reply(code .. ": " .. message)
end

-- A canonical decimal integer within [low, high], or nil. Order ids never pass through here:
-- Lua numbers are doubles, so 64-bit ids stay strings (see is_id).
local function int_arg(s, low, high)
  if type(s) ~= "string" or #s > 15 or not (s == "0" or s:match("^[1-9]%d*$")) then
    return nil
  end
  local n = tonumber(s)
  if n < low or n > high then return nil end
  return n
end

local function is_id(s)
  return type(s) == "string" and s:match("^[1-9]%d*$") ~= nil
    and (#s < 19 or (#s == 19 and s <= MAX_ID))
end

local function is_token(s, max_len)
  return type(s) == "string" and #s >= 1 and #s <= max_len and not s:find("[^\33-\126]")
end

-- Refusals shared by the scripts: each returns an error reply, or nil when the value is fine.
local function bad_item_id(s)
  if not is_id(s) then return invalid("invalid_item_id", "item id must be an integer from 1 to 2^63-1") end
end
local function bad_order_id(s)
  if not is_id(s) then return invalid("invalid_order_id", "order id must be an integer from 1 to 2^63-1") end
end
local function bad_time(now)
  if not now then return invalid("invalid_time", "time must be positive epoch milliseconds") end
end

-- Epoch ms from the caller, or from Redis TIME when the caller sends "".
local function now_arg(s)
  if s == "" then
    local t = redis.call("TIME")
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return int_arg(s, 1, MAX_TIME)
end

-- The sale settings in ARGV[first .. first + 4]: total, starts_at_ms, ends_at_ms,
-- per_buyer_limit, hold_ms. Returns them as a table, or nil and the refusal.
local function sale_args(first)
  local sale = {
    total = int_arg(ARGV[first], 0, MAX_TOTAL),
    starts = int_arg(ARGV[first + 1], 0, MAX_TIME),
    ends = int_arg(ARGV[first + 2], 1, MAX_TIME),
    limit = int_arg(ARGV[first + 3], 1, MAX_QUANTITY),
    hold_ms = int_arg(ARGV[first + 4], 1, MAX_HOLD),
  }
  if not (sale.total and sale.starts and sale.ends and sale.limit and sale.hold_ms)
    or sale.starts >= sale.ends then
    return nil, invalid("invalid_item", "total, sale window, per-buyer limit or hold duration out of range")
  end
  return sale
end

-- Every item-level script receives the same five keys first.
local K = { item = KEYS[1], buyers = KEYS[2], holds = KEYS[3], deadlines = KEYS[4], events = KEYS[5] }

local function load_hold(order_id)
  local raw = redis.call("HGET", K.holds, order_id)
  if not raw then return nil end
  return cjson.decode(raw)
end

local function save_hold(order_id, hold)
  redis.call("HSET", K.holds, order_id, cjson.encode(hold))
end

-- held -> released: the stock returns, the buyer's count drops, the event is journaled.
local function release_hold(item_id, order_id, hold, reason, now)
  local q = hold.quantity
  redis.call("HINCRBY", K.item, "held", -q)
  redis.call("HINCRBY", K.item, "available", q)
  if redis.call("HINCRBY", K.buyers, hold.buyer, -q) <= 0 then
    redis.call("HDEL", K.buyers, hold.buyer) -- keeps the hash as small as the live buyers
  end
  redis.call("ZREM", K.deadlines, order_id)
  hold.state = "released"
  hold.reason = reason
  save_hold(order_id, hold)
  redis.call("XADD", K.events, "*", "event", "released", "item_id", item_id, "order_id", order_id,
    "buyer", hold.buyer, "quantity", q, "reason", reason, "at_ms", now)
end

-- A payment succeeded (confirm.lua, settle_payment.lua): held -> paid. The deadline is the
-- contract and money never brings stock back: a hold released before the payment, or found at
-- or past its deadline (released now, as expired), is marked refund_required instead, and the
-- first such payment journals it; later ones change nothing.
local function pay_hold(item_id, order_id, hold, now)
  if hold.state == "paid" then return { "already_paid" } end
  if hold.state == "held" and now >= hold.deadline_ms then
    release_hold(item_id, order_id, hold, "expired", now)
  end
  if hold.state == "released" then
    if not hold.refund_required then
      hold.refund_required = true
      save_hold(order_id, hold)
      redis.call("XADD", K.events, "*", "event", "refund_required", "item_id", item_id,
        "order_id", order_id, "buyer", hold.buyer, "quantity", hold.quantity, "reason", hold.reason,
        "at_ms", now)
    end
    return { "refund_required", hold.reason }
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
end

-- What a set of holds adds up to: held and paid units, units per buyer, the deadline index.
-- Feed it each hold with tally:add(order_id, hold). Each hold is one order's own record; the
-- counters are only their sum (recount.lua, recover.lua).
local function new_tally()
  local tally = { held = 0, sold = 0, buyers = {}, deadlines = {} }
  function tally:add(order_id, hold)
    if hold.state == "held" then
      self.held = self.held + hold.quantity
      self.deadlines[#self.deadlines + 1] = { hold.deadline_ms, order_id }
    elseif hold.state == "paid" then
      self.sold = self.sold + hold.quantity
    end
    if hold.state ~= "released" then
      self.buyers[hold.buyer] = (self.buyers[hold.buyer] or 0) + hold.quantity
    end
  end
  return tally
end

-- Write a tally as the item's counters, buyers' units and deadline index.
local function save_tally(total, tally)
  redis.call("HSET", K.item, "available", total - tally.held - tally.sold, "held", tally.held,
    "sold", tally.sold)
  redis.call("DEL", K.buyers, K.deadlines)
  for buyer, units in pairs(tally.buyers) do redis.call("HSET", K.buyers, buyer, units) end
  for _, d in ipairs(tally.deadlines) do redis.call("ZADD", K.deadlines, d[1], d[2]) end
end
