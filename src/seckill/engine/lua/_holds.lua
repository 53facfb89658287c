-- _holds.lua: how holds move and add up, placed after _common.lua before the scripts that move
-- or count holds (scripts.HOLD_SCRIPTS); no contract of its own.

local RELEASE_REASONS = { cancelled = true, expired = true, payment_failed = true }

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
