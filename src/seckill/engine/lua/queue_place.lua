-- queue_place.lua: where a buyer stands in an item's waiting room, and how far it has moved.
-- Writes only the seal (see _queue.lua), and only once the sale has started.
--
-- KEYS  1 item  2 queue  3 early  4 late  5 admissions
-- ARGV  1 buyer  2 now (ms; "" = Redis TIME)
--
-- Replies:
--   placed        {placed, position (0: drawn at the start), admitted up to, joined at ms}:
--                 joined at is the start for a buyer who joined before it
--   not_queued    {not_queued, admitted up to}: this buyer has not joined
--   unknown_item  {unknown_item}: no such item loaded
-- Errors (nothing written):
--   invalid_buyer, invalid_time

local buyer, now = ARGV[1], now_arg(ARGV[2])
if not is_token(buyer, 64) then
  return invalid("invalid_buyer", "buyer id must be 1 to 64 visible ASCII characters")
end
if not now then return bad_time(nil) end
local starts = sale_window()
if not starts then return { "unknown_item" } end

local admitted = tonumber(redis.call("HGET", Q.queue, "admitted") or "0")
local late = redis.call("HGET", Q.late, buyer)
if late then
  local position, joined = late:match("^(%d+):(%d+)$")
  return { "placed", tonumber(position), admitted, tonumber(joined) }
end
if not redis.call("ZSCORE", Q.early, buyer) then return { "not_queued", admitted } end
if not sealed(now, starts) then return { "placed", 0, admitted, starts } end
return { "placed", redis.call("ZRANK", Q.early, buyer) + 1, admitted, starts }
