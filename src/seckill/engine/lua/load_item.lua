-- load_item.lua: create an item's sale in Redis, or replace its settings.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events
-- ARGV  1 item id  2 total  3 starts_at_ms  4 ends_at_ms  5 per_buyer_limit  6 hold_ms
--       7 force ("1" or "0")  8 now (ms; "" = Redis TIME)
--       9 stock shards (absent: 1)  10 the item's total (absent: ARGV 2)
--       11 waiting room ("1" or "0"; absent: "0")  12 its positions let in per second and
--       13 how long before the start its queue opens (ms) ("" or absent: the deployment's)
--
-- With stock shards, the keys are one shard's and ARGV 2 its opening share. A shard already
-- loaded keeps its own total (transfers have moved stock since it opened): only the settings
-- change. The item's total and shard count are fixed once loaded (stock_shards_fixed).
-- The `loaded` event carries the item's total (the SQL inventory's), and `shard_total`.
-- A shard loaded now from nothing is verified under this server's run (`run`, see live_run in
-- _common.lua); one already loaded keeps its `run`: reloading settings proves nothing of its
-- holds, so a fenced shard stays fenced until the reconciler verifies it.
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
--   stock_shards_fixed     another shard count than loaded, or with shards another total

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

local shards = int_arg(ARGV[9] or "1", 1, 64)
local item_total = int_arg(ARGV[10] or ARGV[2], 0, MAX_TOTAL)
if not (shards and item_total) then
  return invalid("invalid_item", "stock shards must be from 1 to 64, with the item's total")
end
local queue
queue, refused = queue_args(11)
if refused then return refused end

local counts = redis.call("HMGET", K.item, "held", "sold", "total", "shards", "item_total")
local held, sold = tonumber(counts[1] or "0"), tonumber(counts[2] or "0")
if counts[3] and (tonumber(counts[4] or "1") ~= shards
    or (shards > 1 and tonumber(counts[5]) ~= item_total)) then
  return invalid("stock_shards_fixed", "loaded with " .. (counts[4] or "1") .. " stock shards and a total of "
    .. (counts[5] or counts[3]) .. "; neither changes once loaded with shards")
end
if shards > 1 and counts[3] then total = tonumber(counts[3]) end
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
  "starts_at_ms", starts, "ends_at_ms", ends, "per_buyer_limit", limit, "hold_ms", hold_ms,
  "shards", shards, "item_total", item_total)
save_queue_args(K.item, queue)
if not counts[3] then redis.call("HSET", K.item, "run", live_run()) end
redis.call("XADD", K.events, "*", "event", "loaded", "item_id", item_id, "total", item_total,
  "shard_total", total, "available", available, "starts_at_ms", starts, "ends_at_ms", ends,
  "per_buyer_limit", limit, "hold_ms", hold_ms, "at_ms", now)
return { code }
