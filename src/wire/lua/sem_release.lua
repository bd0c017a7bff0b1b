-- Release one semaphore holder's permits; the queue gets what is free, in order.
-- SCOPE: 'one' or 'all' (also the owner's place in the queue: an acquisition nobody saw, or
-- shutdown); a holder holds once, so both release it whole.
-- Replies: {RELEASED, 0}, or {NOT_HELD} when the owner held nothing.

--#include release_trace
--#include clock
--#include counter
--#include tokens
--#include queue_expiry
--#include queue
--#include semaphore

local owner, scope = OWNER, SCOPE
if scope == 'all' then
  dequeue(owner)
end
local now = now_ms()
local permits, used = sem_state(now)
local held = permits and redis.call('hget', LOCK, owner)
if held then
  local take = tonumber(string.match(held, '^(%d+)'))
  redis.call('hdel', LOCK, owner)
  redis.call('zrem', HOLDERS, owner)
  used = redis.call('hincrby', LOCK, USED_FIELD, -take)
  leave_release_trace(OWNER)
end
if permits then
  local _
  _, _, used = sem_grant(now, permits, used)
  sem_settle(now, used)
end
if held or released_before(OWNER) then
  return {RELEASED, 0}
end
return {NOT_HELD}
