-- Remove a read-write lock whoever holds it (operators only); the queue gets it next: one
-- writer, or the run of readers at its head together.
-- OWNER: this force-unlock's own id, for its trace (see force_unlock.lua).
-- Replies: {REMOVED} when a lock was removed, {WAS_FREE} when it was free.

--#include release_trace
--#include clock
--#include counter
--#include tokens
--#include queue_expiry
--#include queue
--#include rw

if released_before(OWNER) then
  return {REMOVED}
end
local removed = redis.call('del', LOCK, READERS) > 0
rw_grant(now_ms(), nil)
if removed then
  leave_release_trace(OWNER)
  return {REMOVED}
end
return {WAS_FREE}
