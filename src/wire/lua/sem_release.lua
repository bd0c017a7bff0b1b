-- Release one semaphore holder's permits; the queue gets what is free, in order.
-- ARGV[2] owner id, ARGV[3] scope: 'one' or 'all' (also the owner's place in the queue: an
-- acquisition nobody saw, or shutdown); a holder holds once, so both release it whole.
-- Returns {0, 0, 0}, or {-1, 0, 0} when the owner held nothing.
local owner, scope = ARGV[2], ARGV[3]
if scope == 'all' then
  dequeue(owner)
end
local now = now_ms()
local permits, used = sem_state(now)
local held = permits and redis.call('hget', KEYS[1], owner)
if held then
  local take = tonumber(string.match(held, '^(%d+)'))
  redis.call('hdel', KEYS[1], owner)
  redis.call('zrem', HOLDERS, owner)
  used = redis.call('hincrby', KEYS[1], 'used', -take)
end
if permits then
  local _
  _, _, used = sem_grant(now, permits, used)
  sem_settle(now, used)
end
if held then
  return {0, 0, 0}
end
return {-1, 0, 0}
