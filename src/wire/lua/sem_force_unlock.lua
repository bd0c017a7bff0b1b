-- Remove every holder of a semaphore (operators only); the queue gets its permits next, in
-- order, on the permit count the semaphore had.
-- OWNER: this force-unlock's own id, for its trace (see force_unlock.lua).
-- Replies: {REMOVED} when a holder was removed, {WAS_FREE} when nobody held it.

--#include release_trace
--#include clock
--#include counter
--#include tokens
--#include queue_expiry
--#include queue
--#include semaphore

if released_before(OWNER) then
  return {REMOVED}
end
local permits = tonumber(redis.call('hget', LOCK, PERMITS_FIELD))
local removed = redis.call('del', LOCK, HOLDERS) > 0
if permits then
  local now = now_ms()
  local _, _, used = sem_grant(now, permits, 0)
  sem_settle(now, used)
end
if removed then
  leave_release_trace(OWNER)
  return {REMOVED}
end
return {WAS_FREE}
