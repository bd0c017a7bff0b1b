-- Remove a read-write lock whoever holds it (operators only); the queue gets it next: one
-- writer, or the run of readers at its head together.
-- Replies: {REMOVED} when a lock was removed, {WAS_FREE} when it was free.

--#include clock
--#include tokens
--#include queue_expiry
--#include queue
--#include rw

local removed = redis.call('del', LOCK, READERS) > 0
rw_grant(now_ms(), nil)
if removed then
  return {REMOVED}
end
return {WAS_FREE}
