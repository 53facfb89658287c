-- fence.lua: fence a stock shard, or lift its fence once verified (see live_run in _common.lua).
--
-- A detector that finds the shard behind SQL (the persister landing an event that would take a
-- counter below zero, the reconciler finding lost writes) fences it: it sells nothing until
-- verified. The reconciler lifts the fence once it has compared the shard with SQL (and rebuilt
-- what was lost), if the shard's `run` is still what it saw then: a fence raised meanwhile wins.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  (the shard's)
-- ARGV  1 item id  2 action (fence | verify)  3 verify: the `run` seen when verifying ("" for
--       none)  4 fence: why (one word)
--
-- Replies:
--   fenced        {fenced}: fence: the shard's `run` is now "fenced:<why>"
--   verified      {verified}: verify: the shard's `run` is this server's run id
--   moved         {moved}: verify: the shard's `run` is no longer what was seen; nothing changed
--   unknown_item  {unknown_item}: the shard is not loaded; nothing changed
-- Errors (nothing written):
--   invalid_item_id, invalid_fence

local refused = bad_item_id(ARGV[1])
if refused then return refused end
local action, seen, why = ARGV[2], ARGV[3], ARGV[4]
if not (action == "verify" and seen) and not (action == "fence" and is_token(why, 32)) then
  return invalid("invalid_fence", "fence with a reason (one word), or verify with the run seen")
end
if redis.call("EXISTS", K.item) == 0 then return { "unknown_item" } end
if action == "fence" then
  redis.call("HSET", K.item, "run", "fenced:" .. why)
  return { "fenced" }
end
if (redis.call("HGET", K.item, "run") or "") ~= seen then return { "moved" } end
redis.call("HSET", K.item, "run", live_run())
return { "verified" }
