-- Remove a read-write lock whoever holds it (operators only); the queue gets it next: one
-- writer, or the run of readers at its head together.
-- Returns 1 when a lock was removed, 0 when it was free.
local removed = math.min(1, redis.call('del', KEYS[1], READERS))
rw_grant(now_ms(), nil)
return removed
