-- Remove a read-write lock whoever holds it (operators only); the queue gets it next: one
-- writer, or the run of readers at its head together.
-- Returns 1 when a lock was removed, 0 when it was free.
local removed = redis.call('del', KEYS[1])
rw_grant(now_ms(), nil)
return removed
