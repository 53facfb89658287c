-- queue_join.lua: join an item's waiting room, or be told one's place in it again.
--
-- KEYS  1 item  2 queue  3 early  4 late  5 admissions
-- ARGV  1 buyer  2 draw (an integer below 10^15: the buyer's place among those who join before
--       the start)  3 how long before the start the queue opens (ms)
--       4 now (ms; "" = Redis TIME)
--
-- Before the start a buyer joins `early`, scored by its draw: arriving a millisecond sooner buys
-- nothing. At the start the early buyers take positions 1..n in the order of their draws (see
-- _queue.lua's sealed); from then on each joiner takes the next position, first come first
-- served. Positions are unique and contiguous.
--
-- Replies:
--   queued          {queued, position}: joined now; position 0: drawn at the start
--   already_queued  {already_queued, position}: joined before; nothing changed
--   not_started     {not_started, opens at ms}: the queue is not open yet; nothing changed
--   ended           {ended}: the sale is over; nothing changed
--   not_queued      {not_queued}: the item has no waiting room (it sells without one); nothing
--                   changed
--   unknown_item    {unknown_item}: no such item loaded; nothing changed
-- Errors (nothing written):
--   invalid_buyer, invalid_time, invalid_draw

local buyer, draw, lead, now = ARGV[1], int_arg(ARGV[2], 0, 999999999999999), int_arg(ARGV[3], 0, MAX_TIME), now_arg(ARGV[4])
if not is_token(buyer, 64) then
  return invalid("invalid_buyer", "buyer id must be 1 to 64 visible ASCII characters")
end
if not draw then return invalid("invalid_draw", "draw must be an integer below 10^15") end
if not (lead and now) then return bad_time(nil) end

local starts, ends = sale_window()
if not starts then return { "unknown_item" } end
if redis.call("HGET", Q.item, "waiting_room") ~= "1" then return { "not_queued" } end
if now >= ends then return { "ended" } end
lead = tonumber(redis.call("HGET", Q.item, "queue_open_ms") or lead)

local late = redis.call("HGET", Q.late, buyer)
if late then return { "already_queued", tonumber(late:match("^%d+")) } end
local count = sealed(now, starts)
if redis.call("ZSCORE", Q.early, buyer) then
  local position = 0
  if count then position = redis.call("ZRANK", Q.early, buyer) + 1 end
  return { "already_queued", position }
end
if now < starts - lead then return { "not_started", starts - lead } end
if not count then
  redis.call("ZADD", Q.early, draw, buyer)
  return { "queued", 0 }
end
local position = count + redis.call("HINCRBY", Q.queue, "late", 1)
redis.call("HSET", Q.late, buyer, decimal(position) .. ":" .. decimal(now))
return { "queued", position }
