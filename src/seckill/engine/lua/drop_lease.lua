-- drop_lease.lua: end a lease, only if the caller still owns it.
--
-- KEYS  1 the lease
-- ARGV  1 owner token
--
-- Replies:
--   1  dropped
--   0  not ours (lapsed or taken over); nothing changed

if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
