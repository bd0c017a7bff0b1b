-- Remove every holder of a semaphore (operators only); the queue gets its permits next, in
-- order, on the permit count the semaphore had.
-- Returns 1 when a holder was removed, 0 when nobody held it.
local permits = tonumber(redis.call('hget', KEYS[1], 'permits'))
local removed = math.min(1, redis.call('del', KEYS[1], HOLDERS))
if permits then
  local now = now_ms()
  local _, _, used = sem_grant(now, permits, 0)
  sem_settle(now, used)
end
return removed
