-- terms.lua: an item's sale terms as its head holds them, and whether the head is fenced: the
-- one read behind a purchase ticket.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  (the head's; only 1 is read)
-- ARGV  1 item id
--
-- Replies:
--   {total, starts_at_ms, ends_at_ms, per_buyer_limit, hold_ms, shards, item_total, fenced,
--    waiting_room}   each as stored (nil when the item is not loaded); fenced 1 when the head
--                    is not verified under this server's run (see live_run in _common.lua)
-- Errors (nothing written: it writes nothing):
--   invalid_item_id

local refused = bad_item_id(ARGV[1])
if refused then return refused end
local f = redis.call("HMGET", K.item, "total", "starts_at_ms", "ends_at_ms", "per_buyer_limit",
  "hold_ms", "shards", "item_total", "run", "waiting_room")
f[8] = (f[1] and f[8] ~= live_run()) and 1 or 0
return f
