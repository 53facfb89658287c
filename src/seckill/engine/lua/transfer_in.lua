-- transfer_in.lua: a shard receives the units another shard sent it (transfer_out.lua).
--
-- Applied once per transfer id, whoever delivers it (the buyer's request that asked for the
-- units, or the reaper finishing a transfer left in transit): the record of it is kept for as
-- long as the item lives, so a second delivery always finds it.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  (the receiving shard's)
--       6 transfers (the receiving shard's)
-- ARGV  1 item id  2 transfer id  3 sending shard  4 units  5 now (ms; "" = Redis TIME)
--
-- Replies:
--   transferred  {transferred}: total and available +units, the transfer recorded,
--                `transferred_in` appended
--   replay       {replay}: received before; nothing changed
--   unknown_item {unknown_item}: this shard is not loaded; nothing changed
--   item_recovering {item_recovering}: this shard is fenced (see live_run in _common.lua): the
--                units stay in transit, delivered once it is verified; nothing changed
-- Errors (nothing written):
--   invalid_item_id, invalid_time, invalid_transfer

local item_id, transfer_id = ARGV[1], ARGV[2]
local refused = bad_item_id(item_id)
if refused then return refused end
local from, units = int_arg(ARGV[3], 0, 63), int_arg(ARGV[4], 1, MAX_TOTAL)
if not (is_token(transfer_id, 64) and from and units) then
  return invalid("invalid_transfer", "a transfer needs an id, a shard from 0 to 63 and a number of units")
end
local now = now_arg(ARGV[5])
refused = bad_time(now)
if refused then return refused end

if redis.call("HEXISTS", KEYS[6], "in:" .. transfer_id) == 1 then return { "replay" } end
if redis.call("EXISTS", K.item) == 0 then return { "unknown_item" } end
if fenced() then return { "item_recovering" } end
redis.call("HINCRBY", K.item, "total", units)
redis.call("HINCRBY", K.item, "available", units)
redis.call("HSET", KEYS[6], "in:" .. transfer_id, cjson.encode({ from = from, units = units, at_ms = now }))
redis.call("XADD", K.events, "*", "event", "transferred_in", "item_id", item_id,
  "transfer_id", transfer_id, "from_shard", from, "quantity", units, "at_ms", now)
return { "transferred" }
