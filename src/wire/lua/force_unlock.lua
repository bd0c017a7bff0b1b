-- Remove an exclusive (or fair) lock whoever holds it (operators only); the first live
-- waiter gets it next. READERS is the readers' index of a read-write lock of the same name
-- (see rw.lua), which goes with its hash. One key per DEL: a node importing a migrating
-- slot refuses a command on several keys it lacks.
-- OWNER: this force-unlock's own id, for its trace (see release_trace.lua): run twice, it
-- must not remove the lock its first run granted to the next waiter.
-- Replies: {REMOVED} when a lock was removed, {WAS_FREE} when it was free.

--#include release_trace
--#include clock
--#include counter
--#include tokens
--#include queue_expiry
--#include queue

if released_before(OWNER) then
  return {REMOVED}
end
if redis.call('del', LOCK) + redis.call('del', READERS) > 0 then
  leave_release_trace(OWNER)
  grant_head(nil)
  return {REMOVED}
end
return {WAS_FREE}
