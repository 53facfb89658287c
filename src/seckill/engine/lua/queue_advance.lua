-- queue_advance.lua: let the next positions of an item's waiting room in (the inlet's step).
--
-- KEYS  1 item  2 queue  3 early  4 late  5 admissions
-- ARGV  1 rate: positions let in per second (0: no rate cap): the deployment's, used unless the
--       item has its own (`queue_admit_per_second` on its head, set by load_item)
--       2 per unit: positions let in per unit available within one turn (0: no stock cap)
--       3 units available now (the item's, summed over its shards)
--       4 turn (ms): how long an admission counts against the units available
--       5 now (ms; "" = Redis TIME)
--
-- The frontier (`admitted`: every position up to it is in) only moves forward, by the smallest of:
-- everyone queued; the rate's credit (accrued since the last step, at most one second's worth, so
-- an inlet that was away does not let a crowd in at once); and, with a stock cap, `per unit` x
-- available minus those let in during the last turn. A turn's admissions that never bought age
-- out of the cap after it, so units nobody took are offered further down the line. Each step
-- that moves the frontier is appended to `admissions` (its entry id's time is when).
--
-- Replies:
--   advanced      {advanced, admitted up to, queue length, positions let in by this step}
--   not_started   {not_started, starts at ms}: nothing to do before the sale starts
--   ended         {ended}: the sale is over; nothing changed
--   unknown_item  {unknown_item}: no such item loaded
-- Errors (nothing written):
--   invalid_time, invalid_admission

local rate, per_unit = int_arg(ARGV[1], 0, 1000000), int_arg(ARGV[2], 0, 1000000)
local available, turn, now = int_arg(ARGV[3], 0, MAX_TOTAL), int_arg(ARGV[4], 1, MAX_HOLD), now_arg(ARGV[5])
if not (rate and per_unit and available and turn) then
  return invalid("invalid_admission", "rate, per unit, available or turn out of range")
end
if not now then return bad_time(nil) end
local starts, ends = sale_window()
if not starts then return { "unknown_item" } end
if now >= ends then return { "ended" } end
if now < starts then return { "not_started", starts } end
rate = tonumber(redis.call("HGET", Q.item, "queue_admit_per_second") or rate)

local length = sealed(now, starts)
local state = redis.call("HMGET", Q.queue, "late", "admitted", "last_ms", "credit")
length = length + tonumber(state[1] or "0")
local admitted = tonumber(state[2] or "0")
-- Time as the queue has seen it never runs backwards, so the admissions' ids keep rising.
local last = math.max(tonumber(state[3] or "0"), starts)
now = math.max(now, last)

local target = length
local credit = 0
if rate > 0 then
  credit = tonumber(state[4] or "0") + rate * math.min(now - last, 1000) / 1000
  target = math.min(target, admitted + math.floor(credit))
end
if per_unit > 0 then
  local before = redis.call("XREVRANGE", Q.admissions, decimal(math.max(now - turn, 0)), "-", "COUNT", 1)
  local frontier = before[1] and tonumber(before[1][2][2]) or 0
  target = math.min(target, frontier + per_unit * available)
end
local moved = 0
if target > admitted then
  moved = target - admitted
  -- The entry id spelled out (Redis 6.2 has no "<ms>-*"): the next in this millisecond.
  local seq = 0
  local latest = redis.call("XREVRANGE", Q.admissions, "+", "-", "COUNT", 1)[1]
  if latest and latest[1]:match("^(%d+)-") == decimal(now) then
    seq = tonumber(latest[1]:match("-(%d+)$")) + 1
  end
  redis.call("XADD", Q.admissions, decimal(now) .. "-" .. seq, "upto", decimal(target))
  credit = credit - moved
  admitted = target
end
credit = math.max(0, math.min(credit, rate))
redis.call("HSET", Q.queue, "admitted", decimal(admitted), "last_ms", decimal(now), "credit", tostring(credit))
return { "advanced", admitted, length, moved }
