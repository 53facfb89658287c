-- _queue.lua: helpers that scripts.py places after _common.lua before every waiting-room
-- script; no contract of its own. Those scripts take the keys of engine.keys.QueueKeys.

local Q = { item = KEYS[1], queue = KEYS[2], early = KEYS[3], late = KEYS[4], admissions = KEYS[5] }

-- How many joined before the start: fixed by the first queue script to run once the sale has
-- started. Until then nobody has a number, and from then on nobody joins `early`, so each early
-- buyer's position (its rank in `early`) never changes.
local function sealed(now, starts)
  local count = redis.call("HGET", Q.queue, "sealed")
  if count then return tonumber(count) end
  if now < starts then return nil end
  count = redis.call("ZCARD", Q.early)
  redis.call("HSET", Q.queue, "sealed", count)
  return count
end

-- The sale window from the item's head, or nil for an item not loaded.
local function sale_window()
  local window = redis.call("HMGET", Q.item, "starts_at_ms", "ends_at_ms")
  if not window[1] then return nil end
  return tonumber(window[1]), tonumber(window[2])
end
