-- snapshot.lua: one stock shard's whole state, read at one instant (a script runs alone).
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  6 transfers  7 payments
--       8 in-transit
-- ARGV  1 item id
--
-- Replies:
--   {now ms, item hash, holds hash, buyers hash, deadlines, events, last id, transfers hash,
--    payments hash, live run, in transit}  live run: this server's run id (the shard is
--                    fenced unless the item hash's `run` is it: see live_run in _common.lua);
--                    in transit: the ids of the transfers this shard sent and has not seen
--                    delivered
--                    each hash flat (field, value, ...); deadlines flat (order id, deadline ms,
--                    ...); events as XRANGE gives them; last id the stream's last generated
--                    ("0-0": no stream); now the server's clock as the script ran
-- Errors (nothing written: it writes nothing):
--   invalid_item_id

local refused = bad_item_id(ARGV[1])
if refused then return refused end

local t = redis.call("TIME")
local last = last_event_id()
return {
  t[1] * 1000 + math.floor(t[2] / 1000),
  redis.call("HGETALL", K.item),
  redis.call("HGETALL", K.holds),
  redis.call("HGETALL", K.buyers),
  redis.call("ZRANGE", K.deadlines, 0, -1, "WITHSCORES"),
  redis.call("XRANGE", K.events, "-", "+"),
  last,
  redis.call("HGETALL", KEYS[6]),
  redis.call("HGETALL", KEYS[7]),
  live_run(),
  redis.call("ZRANGE", KEYS[8], 0, -1),
}
