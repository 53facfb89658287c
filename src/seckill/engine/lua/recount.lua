-- recount.lua: set an item's counters, buyers' units and deadline index from its holds.
--
-- Each hold is one order's own record, kept by the same scripts that move the counters; the
-- counters are only their sum. So when the two disagree (a counter edited by hand), the holds
-- win. O(holds): an operator's repair, never on the purchase path.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events
-- ARGV  1 item id
--
-- Replies:
--   recounted  {recounted, available, held, sold}: the counters as they now stand
--   unknown_item  {unknown_item}: the item is not loaded
-- Errors (nothing written):
--   invalid_item_id
--   holds_exceed_total  held and paid holds add up to more than the total: no count fixes that

local refused = bad_item_id(ARGV[1])
if refused then return refused end
local total = tonumber(redis.call("HGET", K.item, "total") or "-1")
if total < 0 then return { "unknown_item" } end

local tally = new_tally()
local raw = redis.call("HGETALL", K.holds)
for i = 1, #raw, 2 do tally:add(raw[i], cjson.decode(raw[i + 1])) end
local held, sold = tally.held, tally.sold
if held + sold > total then
  return invalid("holds_exceed_total", "held " .. held .. " + paid " .. sold .. " exceed the total " .. total)
end
save_tally(total, tally)
return { "recounted", total - held - sold, held, sold }
