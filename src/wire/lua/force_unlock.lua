-- Remove a lock whoever holds it (operators only); the first live waiter gets it next.
-- Returns 1 when a lock was removed, 0 when it was free.
if redis.call('del', KEYS[1]) == 1 then
  grant_head(nil)
  return 1
end
return 0
