-- Remove a lock whoever holds it, and wake its waiters (operators only).
-- KEYS[1] the lock hash, KEYS[2] the release channel
-- Returns 1 when a lock was removed, 0 when it was free.
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', KEYS[2], 'released')
  return 1
end
return 0
