-- archive.lua: remove one settled stock shard of an item from Redis, all of its keys at once.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  6 dead letters  7 payments
--       8 transfers  9 in transit  10.. the rest of the shard's keys (shard 0: its waiting room
--       and its card)
-- ARGV  1 item id  2 now (ms; "" = Redis TIME)
--       3 the stream's last generated id as the caller read it ("0-0": no stream)
--       4 how many payment notices the caller read  5 how many dead letters the caller read
--
-- Replies:
--   archived   {archived}: every key given was deleted (or the shard was already gone)
--   unsettled  {unsettled, why}: nothing deleted; why is one of
--              not_ended  the sale has not ended
--              held       a hold is held, or a stock transfer is in transit
--              backlog    a consumer group has not acknowledged every entry (or none was made)
--              moved      the stream, the payments or the dead letters changed since the caller
--                         read them (what the caller moved to SQL is no longer everything)
-- Errors (nothing written):
--   invalid_item_id, invalid_time

local refused = bad_item_id(ARGV[1])
if refused then return refused end
local now = now_arg(ARGV[2])
refused = bad_time(now)
if refused then return refused end

local function field(flat, name)
  for i = 1, #flat, 2 do
    if flat[i] == name then return flat[i + 1] end
  end
end

if redis.call("EXISTS", K.item) == 1 then
  local head = redis.call("HMGET", K.item, "ends_at_ms", "held")
  if now < tonumber(head[1]) then return { "unsettled", "not_ended" } end
  if tonumber(head[2]) ~= 0 or redis.call("ZCARD", K.deadlines) > 0
    or redis.call("ZCARD", KEYS[9]) > 0 then
    return { "unsettled", "held" }
  end
  local last = "0-0"
  if redis.call("EXISTS", K.events) == 1 then
    last = last_event_id()
    local groups = redis.call("XINFO", "GROUPS", K.events)
    if last ~= "0-0" and #groups == 0 then return { "unsettled", "backlog" } end
    for _, group in ipairs(groups) do
      if tonumber(field(group, "pending")) ~= 0 or field(group, "last-delivered-id") ~= last then
        return { "unsettled", "backlog" }
      end
    end
  end
  if last ~= ARGV[3]
    or redis.call("HLEN", KEYS[7]) ~= tonumber(ARGV[4])
    or redis.call("XLEN", KEYS[6]) ~= tonumber(ARGV[5]) then
    return { "unsettled", "moved" }
  end
end
redis.call("DEL", unpack(KEYS))
return { "archived" }
