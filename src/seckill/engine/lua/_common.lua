-- _common.lua: helpers that scripts.py places before every item script; no contract of its own.
-- The input rules mirror seckill/domain/rules.py; a test feeds both the same inputs.
-- Every call runs the whole text sent, and each helper defined here costs its closure on every
-- call: helpers that only some scripts use live in _holds.lua.

local MAX_ID = "9223372036854775807"
local MAX_QUANTITY = 1000000
local MAX_TOTAL = 1000000000000
local MAX_TIME = 90000000000000 -- time + hold stays within cjson's 14 significant digits
local MAX_HOLD = 2592000000
local MAX_BATCH = 10000

local function invalid(code, message)
  return redis.error_reply(code .. ": " .. message)
end

-- A canonical decimal integer within [low, high], or nil. Order ids never pass through here:
-- Lua numbers are doubles, so 64-bit ids stay strings (see is_id).
local function int_arg(s, low, high)
  if type(s) ~= "string" or #s > 15 or not (s == "0" or s:find("^[1-9]%d*$")) then
    return nil
  end
  local n = tonumber(s)
  if n < low or n > high then return nil end
  return n
end

local function is_id(s)
  return type(s) == "string" and s:find("^[1-9]%d*$") ~= nil
    and (#s < 19 or (#s == 19 and s <= MAX_ID))
end

local function is_token(s, max_len)
  return type(s) == "string" and #s >= 1 and #s <= max_len and not s:find("[^\33-\126]")
end

-- Refusals shared by the scripts: each returns an error reply, or nil when the value is fine.
local function bad_item_id(s)
  if not is_id(s) then return invalid("invalid_item_id", "item id must be an integer from 1 to 2^63-1") end
end
local function bad_order_id(s)
  if not is_id(s) then return invalid("invalid_order_id", "order id must be an integer from 1 to 2^63-1") end
end
local function bad_time(now)
  if not now then return invalid("invalid_time", "time must be positive epoch milliseconds") end
end

-- Epoch ms from the caller, or from Redis TIME when the caller sends "".
local function now_arg(s)
  if s == "" then
    local t = redis.call("TIME")
    return t[1] * 1000 + math.floor(t[2] / 1000)
  end
  return int_arg(s, 1, MAX_TIME)
end

-- An integer as a decimal string: redis.call prints a Lua number with %.17g, which costs a few
-- times more, so hot paths hand it strings.
local function decimal(n)
  return string.format("%d", n)
end

-- The sale settings in ARGV[first .. first + 4]: total, starts_at_ms, ends_at_ms,
-- per_buyer_limit, hold_ms. Returns them as a table, or nil and the refusal.
local function sale_args(first)
  local sale = {
    total = int_arg(ARGV[first], 0, MAX_TOTAL),
    starts = int_arg(ARGV[first + 1], 0, MAX_TIME),
    ends = int_arg(ARGV[first + 2], 1, MAX_TIME),
    limit = int_arg(ARGV[first + 3], 1, MAX_QUANTITY),
    hold_ms = int_arg(ARGV[first + 4], 1, MAX_HOLD),
  }
  if not (sale.total and sale.starts and sale.ends and sale.limit and sale.hold_ms)
    or sale.starts >= sale.ends then
    return nil, invalid("invalid_item", "total, sale window, per-buyer limit or hold duration out of range")
  end
  return sale
end

-- An item's waiting room from ARGV[first .. first + 2]: "1" or "0" (absent: "0"), then its pace
-- (positions a second) and its queue's lead (ms), each "" or absent for the deployment's. Read
-- before anything is written; saved on the head by save_queue_args.
local function queue_args(first)
  local room, admit, open_ms = ARGV[first] or "0", ARGV[first + 1] or "", ARGV[first + 2] or ""
  if not ((room == "1" or room == "0") and (admit == "" or int_arg(admit, 0, 1000000))
      and (open_ms == "" or int_arg(open_ms, 0, MAX_TIME))) then
    return nil, invalid("invalid_item", "waiting room must be 1 or 0, its pace and lead integers in range")
  end
  return { room = room, admit = admit, open_ms = open_ms }
end

local function save_queue_args(key, queue)
  redis.call("HSET", key, "waiting_room", queue.room)
  -- Unset: the deployment's (the inlet's and the API's settings).
  if queue.admit == "" then redis.call("HDEL", key, "queue_admit_per_second")
  else redis.call("HSET", key, "queue_admit_per_second", queue.admit) end
  if queue.open_ms == "" then redis.call("HDEL", key, "queue_open_ms")
  else redis.call("HSET", key, "queue_open_ms", queue.open_ms) end
end

-- This server's run id: a new one at every start. A shard's head keeps, in `run`, the run id it
-- was loaded or last verified under; under any other (Redis restarted, perhaps from an older
-- AOF; a replica promoted, perhaps one that missed writes; the slot moved) the shard is fenced:
-- it sells nothing until the reconciler has compared it with SQL and rebuilt what was lost.
-- A detector that finds the shard behind SQL fences it by writing another word there.
local function live_run()
  local info = redis.call("INFO", "server")
  local at = string.find(info, "run_id:", 1, true)
  return string.sub(info, at + 7, at + 46)
end

-- Every item-level script receives the same five keys first.
local K = { item = KEYS[1], buyers = KEYS[2], holds = KEYS[3], deadlines = KEYS[4], events = KEYS[5] }

-- Whether this shard is fenced (see live_run): not verified under this server's run. Asked
-- once the shard is known to be loaded.
local function fenced()
  return redis.call("HGET", K.item, "run") ~= live_run()
end

-- A stream entry id's two parts as numbers; nil for anything else.
local function id_parts(id)
  local ms, seq = string.match(type(id) == "string" and id or "", "^(%d+)-(%d+)$")
  return tonumber(ms), tonumber(seq)
end

-- The id the shard's stream generated last ("0-0": no stream yet).
local function last_event_id()
  if redis.call("EXISTS", K.events) == 0 then return "0-0" end
  local info = redis.call("XINFO", "STREAM", K.events)
  for i = 1, #info, 2 do
    if info[i] == "last-generated-id" then return info[i + 1] end
  end
end

local function load_hold(order_id)
  local raw = redis.call("HGET", K.holds, order_id)
  if not raw then return nil end
  return cjson.decode(raw)
end

-- A JSON string of visible ASCII (a buyer or payment id): only a quote or a backslash needs
-- escaping.
local function json_text(s)
  return s:find('["\\]') and cjson.encode(s) or '"' .. s .. '"'
end

-- A hold record: JSON {buyer, quantity, deadline_ms, state, reason (once released),
-- refund_required (once true), payment_id (once paid: the payment that paid it)}, read by
-- load_hold, recount.lua, recover.lua and Python (engine._hold). Written out by hand, as
-- cjson.encode costs several times as much and every purchase writes one: each value is a
-- number or a fixed word but the buyer and the payment id. Numbers may come as strings of digits.
local function hold_json(buyer, quantity, deadline_ms, state, reason, refund_required, payment_id)
  local record = '{"buyer":' .. json_text(buyer) .. ',"quantity":' .. quantity
    .. ',"deadline_ms":' .. deadline_ms .. ',"state":"' .. state .. '"'
  if reason then record = record .. ',"reason":"' .. reason .. '"' end
  if refund_required then record = record .. ',"refund_required":true' end
  if payment_id then record = record .. ',"payment_id":' .. json_text(payment_id) end
  return record .. "}"
end

local function save_hold(order_id, hold)
  redis.call("HSET", K.holds, order_id, hold_json(hold.buyer, hold.quantity, hold.deadline_ms,
    hold.state, hold.reason, hold.refund_required, hold.payment_id))
end
