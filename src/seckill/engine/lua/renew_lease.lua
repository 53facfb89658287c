-- renew_lease.lua: extend a lease only while it still holds the owner's token.
--
-- KEYS  1 the lease
-- ARGV  1 owner token  2 lease duration (ms)
--
-- Replies:
--   1  renewed
--   0  the lease lapsed or another owner holds it; nothing changed

if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
