-- Remove a lock whoever holds it (operators only); the first live waiter gets it next.
-- Returns 1 when a lock was removed, 0 when it was free. KEYS[6] is the readers' index of a
-- read-write lock of the same name (see rw.lua), which goes with its hash. One key per DEL:
-- a node importing a migrating slot refuses a command on several keys it lacks.
if redis.call('del', KEYS[1]) + redis.call('del', KEYS[6]) > 0 then
  grant_head(nil)
  return 1
end
return 0
