-- transfer_out.lua: a shard gives some of its available stock to another shard of the item.
--
-- The first half of a transfer; transfer_in.lua on the receiving shard is the second. Between
-- the two the units are in transit: out of this shard's total, not yet in the other's, recorded
-- here (the transfers hash and the in-transit index) so a reader counts them and the reaper
-- delivers them if the sender of the first half never sends the second.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  (this shard's)
--       6 transfers  7 in-transit  (this shard's)
-- ARGV  1 item id  2 transfer id  3 receiving shard  4 units needed  5 now (ms; "" = Redis TIME)
--
-- Units given: the need, or all that is available if that is less. Never more: every unit that
-- moves has a buyer on its way to reserve it, so none is left on a shard where nobody asks.
--
-- Replies:
--   transferred  {transferred, units}: units left this shard (total and available -units), the
--                transfer is recorded and indexed as in transit, `transferred_out` appended
--   replay       {replay, units}: this transfer id was sent before; nothing changed
--   sold_out     {sold_out}: nothing available here; nothing changed
--   unknown_item {unknown_item}
--   item_recovering {item_recovering}: this shard is fenced (see live_run in _common.lua);
--                nothing changed
-- Errors (nothing written):
--   invalid_item_id, invalid_time, invalid_transfer

local item_id, transfer_id = ARGV[1], ARGV[2]
local refused = bad_item_id(item_id)
if refused then return refused end
local to, need = int_arg(ARGV[3], 0, 63), int_arg(ARGV[4], 1, MAX_QUANTITY)
if not (is_token(transfer_id, 64) and to and need) then
  return invalid("invalid_transfer", "a transfer needs an id, a shard from 0 to 63 and 1 to " .. MAX_QUANTITY .. " units")
end
local now = now_arg(ARGV[5])
refused = bad_time(now)
if refused then return refused end

local sent = redis.call("HGET", KEYS[6], "out:" .. transfer_id)
if sent then return { "replay", cjson.decode(sent).units } end
local available = redis.call("HGET", K.item, "available")
if not available then return { "unknown_item" } end
available = tonumber(available)
if available <= 0 then return { "sold_out" } end
if fenced() then return { "item_recovering" } end
local units = math.min(available, need)

redis.call("HINCRBY", K.item, "total", -units)
redis.call("HINCRBY", K.item, "available", -units)
redis.call("HSET", KEYS[6], "out:" .. transfer_id, cjson.encode({ to = to, units = units, at_ms = now }))
redis.call("ZADD", KEYS[7], now, transfer_id)
redis.call("XADD", K.events, "*", "event", "transferred_out", "item_id", item_id,
  "transfer_id", transfer_id, "to_shard", to, "quantity", units, "at_ms", now)
return { "transferred", units }
