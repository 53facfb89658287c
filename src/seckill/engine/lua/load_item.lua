-- load_item.lua: create an item's sale in Redis, or replace its settings.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events
-- ARGV  1 item id  2 total  3 starts_at_ms  4 ends_at_ms  5 per_buyer_limit  6 hold_ms
--       7 force ("1" or "0")  8 now (ms; "" = Redis TIME)
--
-- Replies:
--   loaded      {loaded}: a new item, or one with nothing held or sold: available = total
--   reloaded    {reloaded}: forced on an item with holds or sales: settings replaced, held and
--               sold kept, available = total - held - sold
-- Errors (nothing written):
--   invalid_item_id, invalid_item, invalid_time
--   item_active            holds or sales exist and force is not set: stock is never reset
--   total_below_committed  forced, but the new total is below held + sold
--   limit_below_committed  forced, but a buyer already holds or bought more than the new limit

local item_id = ARGV[1]
local refused = bad_item_id(item_id)
if refused then return refused end
local sale
sale, refused = sale_args(2)
if refused then return refused end
local total, starts, ends, limit, hold_ms = sale.total, sale.starts, sale.ends, sale.limit, sale.hold_ms
local now = now_arg(ARGV[8])
refused = bad_time(now)
if refused then return refused end

local counts = redis.call("HMGET", K.item, "held", "sold")
local held, sold = tonumber(counts[1] or "0"), tonumber(counts[2] or "0")
local code = "loaded"
if held > 0 or sold > 0 then
  if ARGV[7] ~= "1" then
    return invalid("item_active", held .. " held and " .. sold .. " sold; stock is not reset (force keeps them)")
  end
  if total < held + sold then
    return invalid("total_below_committed", "total " .. total .. " is below held + sold = " .. (held + sold))
  end
  local buyers = redis.call("HGETALL", K.buyers) -- O(buyers), on a rare operator action
  for i = 1, #buyers, 2 do
    if tonumber(buyers[i + 1]) > limit then
      return invalid("limit_below_committed", "buyer " .. buyers[i] .. " already has " .. buyers[i + 1]
        .. " units, above the new per-buyer limit of " .. limit)
    end
  end
  code = "reloaded"
end

local available = total - held - sold
redis.call("HSET", K.item, "total", total, "available", available, "held", held, "sold", sold,
  "starts_at_ms", starts, "ends_at_ms", ends, "per_buyer_limit", limit, "hold_ms", hold_ms)
redis.call("XADD", K.events, "*", "event", "loaded", "item_id", item_id, "total", total,
  "available", available, "starts_at_ms", starts, "ends_at_ms", ends, "per_buyer_limit", limit,
  "hold_ms", hold_ms, "at_ms", now)
return { code }
