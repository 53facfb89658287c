-- expire_due.lua: release holds whose deadline has come, oldest first.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events
-- ARGV  1 item id  2 now (ms; "" = Redis TIME)  3 batch limit (most holds to release)
--
-- Replies:
--   {order id, ...}  the holds released now, oldest deadline first, each as release.lua would
--                    with reason `expired` (empty when nothing is due, or when the shard is
--                    fenced: see live_run in _common.lua; its holds wait for it to be verified)
-- Errors (nothing written):
--   invalid_item_id, invalid_time, invalid_batch

local item_id = ARGV[1]
local now = now_arg(ARGV[2])
local refused = bad_item_id(item_id) or bad_time(now)
if refused then return refused end
local limit = int_arg(ARGV[3], 1, MAX_BATCH)
if not limit then return invalid("invalid_batch", "batch limit must be from 1 to " .. MAX_BATCH) end

local released = {}
local due = redis.call("ZRANGEBYSCORE", K.deadlines, "-inf", now, "LIMIT", 0, limit)
if #due > 0 and fenced() then return released end
for _, order_id in ipairs(due) do
  local hold = load_hold(order_id)
  if hold and hold.state == "held" then
    release_hold(item_id, order_id, hold, "expired", now)
    released[#released + 1] = order_id
  else
    redis.call("ZREM", K.deadlines, order_id) -- only held orders belong in the index
  end
end
return released
