-- restore_events.lua: put back on a shard's stream the events SQL landed from it that the
-- stream no longer has (Redis went back: an older AOF, a lagging replica promoted), each under
-- its own entry id. A bridge that had not read them then publishes each under the message id
-- it would have had (a copy of one it did publish is dropped by that id); the persister finds
-- each landed already and only acknowledges it. A stream's ids only grow: an entry at or below
-- the stream's last id is skipped (the stream has it, or had it and trimmed it once every group
-- was done with it).
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  (the shard's)
-- ARGV  1 item id  2 JSON [[entry id, [field, value, ...]], ...] in ascending id order, every
--       field and value a string
--
-- Replies:
--   {restored, skipped}
-- Errors (nothing written):
--   invalid_item_id, invalid_batch

local refused = bad_item_id(ARGV[1])
if refused then return refused end
local ok, entries = pcall(cjson.decode, ARGV[2])
if not ok or type(entries) ~= "table" or #entries > MAX_BATCH then
  return invalid("invalid_batch", "a JSON list of [entry id, [field, value, ...]], at most " .. MAX_BATCH)
end
for _, entry in ipairs(entries) do
  local fields = entry[2]
  local good = id_parts(entry[1]) and type(fields) == "table" and #fields > 0 and #fields % 2 == 0
  for _, v in ipairs(good and fields or {}) do
    if type(v) ~= "string" then good = false end
  end
  if not good then
    return invalid("invalid_batch", "an entry is not [entry id, [field, value, ...]] of strings")
  end
end

local last_ms, last_seq = id_parts(last_event_id())
local restored, skipped = 0, 0
for _, entry in ipairs(entries) do
  local ms, seq = id_parts(entry[1])
  if ms > last_ms or (ms == last_ms and seq > last_seq) then
    redis.call("XADD", K.events, entry[1], unpack(entry[2]))
    last_ms, last_seq, restored = ms, seq, restored + 1
  else
    skipped = skipped + 1
  end
end
return { restored, skipped }
