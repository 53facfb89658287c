-- recover.lua: rebuild one stock shard of an item (an unsharded item's only one) from the SQL
-- record after Redis lost state (restarted empty, an older AOF, a failover), merged with
-- whatever Redis still holds, in one step.
--
-- Per order, the record that is further along wins: SQL's landed events were emitted by Redis
-- and acknowledged, so a Redis that lacks them lost them; a Redis hold further along than SQL
-- has events still on their way to SQL. Where the two went different ways (paid in one,
-- released in the other) SQL wins and the order is counted as a conflict. Counters, buyers'
-- units and the deadline index are then recomputed from the merged holds. Rebuilt, the shard is
-- verified under this server's run (`run`, see live_run in _common.lua): it sells again.
--
-- With stock shards the caller first asks each shard what its merged holds add up to (a plan:
-- nothing written), then gives each its total so the shards add up to the item's: the shards'
-- transfer records are cleared (every transfer, in transit or not, is settled by the totals).
--
-- The payments SQL knows (each paid order's payment, each refund owed) are recorded again under
-- their payment ids, where Redis lost them, so a provider's retry is answered as it was.
--
-- KEYS  1 item  2 buyers  3 holds  4 deadlines  5 events  6 payments  7 transfers
--       8 in transit  (the shard's)
-- ARGV  1 item id  2 total (the shard's)  3 starts_at_ms  4 ends_at_ms  5 per_buyer_limit
--       6 hold_ms  7 now (ms; "" = Redis TIME)  8 the newest event id SQL has landed from this
--       shard's stream ("0-0": none)
--       9 SQL's orders of this shard: JSON [[order id (string), buyer, quantity, status,
--         deadline_ms, reason, payment id or null], ...]
--       10 SQL's successful payments of this shard: JSON [[payment id, order id (string),
--          outcome, reason or null], ...] (outcome paid or refund_required)
--       11 the item's stock shards  12 the item's total  13 "plan" to only plan
--       14 15 16 its waiting room, pace and queue lead, as load_item takes them (so a head
--       rebuilt from nothing keeps its room)
--
-- Replies:
--   recovered  {recovered, restored, advanced, conflicts, available, held, sold}: holds created
--              from SQL, holds moved forward to SQL's state, orders where the two disagreed
--   planned    {planned, restored, advanced, conflicts, 0, held, sold}: what recovering would
--              do, nothing written (held + sold may then exceed the total)
-- Errors (nothing written):
--   invalid_item_id, invalid_item, invalid_time, invalid_order_id
--   invalid_recovery    the orders argument is not what this script takes
--   holds_exceed_total  the merged holds add up to more than the total (sold twice: refunds
--                       are a person's decision, so nothing is written)

local item_id = ARGV[1]
local refused = bad_item_id(item_id)
if refused then return refused end
local sale
sale, refused = sale_args(2)
if refused then return refused end
local total = sale.total
local now = now_arg(ARGV[7])
refused = bad_time(now)
if refused then return refused end
local shards = int_arg(ARGV[11] or "1", 1, 64)
local item_total = int_arg(ARGV[12] or ARGV[2], 0, MAX_TOTAL)
if not (shards and item_total) then
  return invalid("invalid_item", "stock shards must be from 1 to 64, with the item's total")
end
local plan_only = ARGV[13] == "plan"
local queue
queue, refused = queue_args(14)
if refused then return refused end
local sql_ms, sql_seq = string.match(ARGV[8], "^(%d+)-(%d+)$")
local ok, orders = pcall(cjson.decode, ARGV[9])
local paid_ok, payments = pcall(cjson.decode, ARGV[10] or "[]")
if not sql_ms or not ok or type(orders) ~= "table" or not paid_ok or type(payments) ~= "table" then
  return invalid("invalid_recovery",
    "expected the newest landed event id and JSON lists of orders and payments")
end

for _, p in ipairs(payments) do
  if not is_token(p[1], 64) or not is_id(p[2])
    or (p[3] ~= "paid" and p[3] ~= "refund_required") then
    return invalid("invalid_recovery", "a payment is not [payment id, order id, outcome, reason]")
  end
end

-- Each status, and the statuses an order can move on to from it.
local LATER = {
  held = { paid = true, released = true, refund_required = true },
  released = { refund_required = true },
  paid = {}, refund_required = {},
}
local function status_of(hold)
  if hold.refund_required then return "refund_required" end
  return hold.state
end

local merged, restored, advanced, conflicts = {}, 0, 0, 0
for _, o in ipairs(orders) do
  local order_id, buyer, quantity, status, deadline, reason, payment_id =
    o[1], o[2], o[3], o[4], o[5], o[6], o[7]
  refused = bad_order_id(order_id)
  if refused then return refused end
  if type(buyer) ~= "string" or type(quantity) ~= "number" or LATER[status] == nil
    or type(deadline) ~= "number" then
    return invalid("invalid_recovery",
      "order " .. order_id .. " is not [id, buyer, quantity, status, deadline_ms, reason, payment id]")
  end
  local hold = load_hold(order_id)
  local mine = hold and status_of(hold)
  if not hold or mine ~= status then
    if hold and LATER[status][mine] then
      -- Redis is further along: its events are still on their way to SQL. Keep it.
    else
      if not hold then restored = restored + 1
      elseif LATER[mine][status] then advanced = advanced + 1
      else conflicts = conflicts + 1 end
      local new = { buyer = buyer, quantity = quantity, deadline_ms = deadline,
        state = status == "refund_required" and "released" or status }
      if new.state == "released" then new.reason = (reason ~= cjson.null and reason) or "expired" end
      if status == "refund_required" then new.refund_required = true end
      if status == "paid" and type(payment_id) == "string" then new.payment_id = payment_id end
      merged[order_id] = new
    end
  end
end

-- Counters from every hold as it will stand.
local tally = new_tally()
local raw = redis.call("HGETALL", K.holds)
for i = 1, #raw, 2 do
  if not merged[raw[i]] then tally:add(raw[i], cjson.decode(raw[i + 1])) end
end
for order_id, hold in pairs(merged) do tally:add(order_id, hold) end
local held, sold = tally.held, tally.sold
if plan_only then return { "planned", restored, advanced, conflicts, 0, held, sold } end
if held + sold > total then
  return invalid("holds_exceed_total", "held " .. held .. " + paid " .. sold .. " exceed the total " .. total)
end

for order_id, hold in pairs(merged) do save_hold(order_id, hold) end
for _, p in ipairs(payments) do
  local reason = p[4] ~= cjson.null and p[4] or nil
  redis.call("HSETNX", KEYS[6], p[1],
    cjson.encode({ order_id = p[2], succeeded = true, outcome = p[3], reason = reason }))
end
redis.call("HSET", K.item, "total", total, "starts_at_ms", sale.starts, "ends_at_ms", sale.ends,
  "per_buyer_limit", sale.limit, "hold_ms", sale.hold_ms, "shards", shards,
  "item_total", item_total, "run", live_run())
save_queue_args(K.item, queue)
save_tally(total, tally)
if shards > 1 then redis.call("DEL", KEYS[7], KEYS[8]) end

-- New entries must sort after everything SQL landed, or the ledger would take a new event for
-- one it has seen (same id) and skip it. Time has moved on since, unless a clock stepped back.
local id = "*"
if tonumber(sql_ms) >= now then id = sql_ms .. "-" .. (tonumber(sql_seq) + 1) end
if id ~= "*" then
  local ms, seq = id_parts(last_event_id())
  if ms > tonumber(sql_ms) or (ms == tonumber(sql_ms) and seq > tonumber(sql_seq)) then id = "*" end
end
redis.call("XADD", K.events, id, "event", "loaded", "item_id", item_id, "total", item_total,
  "shard_total", total, "available", total - held - sold, "starts_at_ms", sale.starts, "ends_at_ms", sale.ends,
  "per_buyer_limit", sale.limit, "hold_ms", sale.hold_ms, "at_ms", now, "recovered", "1")
return { "recovered", restored, advanced, conflicts, total - held - sold, held, sold }
