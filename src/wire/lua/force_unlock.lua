-- Remove an exclusive (or fair) lock whoever holds it (operators only); the first live
-- waiter gets it next. READERS is the readers' index of a read-write lock of the same name
-- (see rw.lua), which goes with its hash. One key per DEL: a node importing a migrating
-- slot refuses a command on several keys it lacks.
-- Replies: {REMOVED} when a lock was removed, {WAS_FREE} when it was free.

--#include clock
--#include tokens
--#include queue_expiry
--#include queue

if redis.call('del', LOCK) + redis.call('del', READERS) > 0 then
  grant_head(nil)
  return {REMOVED}
end
return {WAS_FREE}
