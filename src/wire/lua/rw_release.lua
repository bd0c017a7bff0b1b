-- Release holds of a read-write lock; when the lock comes free (or only readers are left),
-- the queue gets it: one writer, or the run of readers at its head together.
-- SCOPE: 'one' (one hold) or 'all' (every hold of the role, and the owner's place in the
-- queue: an acquisition nobody saw, or shutdown); ROLE: the role of the holds, 'read' or
-- 'write'. A writer whose last write hold goes while it still has read holds keeps the lock
-- for reading (a downgrade), with what its lease had left.
-- Replies: {RELEASED, holds of the role left}, or {NOT_HELD} when the owner held none.

--#include clock
--#include tokens
--#include queue_expiry
--#include queue
--#include rw

local owner, scope, role = OWNER, SCOPE, ROLE
if scope == 'all' then
  dequeue(owner)
end
local now = now_ms()
local state = rw_state(now)
local held = state and redis.call('hget', LOCK, owner)
if not held or (role == 'write' and state == 'read') then
  -- Not held (a lease that ran out, or a write guard of an owner that downgraded); the
  -- lock may have come free meanwhile, and then the queue gets it.
  if state == nil or state == 'read' then
    rw_grant(now, state)
  end
  return {NOT_HELD}
end
if role == 'read' and state == 'write' then
  -- The read holds the writer took inside its write lock.
  local reads = tonumber(redis.call('hget', LOCK, owner .. ':r'))
  if not reads then
    return {NOT_HELD}
  end
  local left = 0
  if scope == 'one' then
    left = reads - 1
  end
  if left > 0 then
    redis.call('hset', LOCK, owner .. ':r', left)
  else
    redis.call('hdel', LOCK, owner .. ':r')
  end
  return {RELEASED, left}
end
local holds, deadline = string.match(held, '^(%d+) ?(%d*)$')
local left = 0
if scope == 'one' then
  left = tonumber(holds) - 1
end
if left > 0 then
  if deadline ~= '' then
    redis.call('hset', LOCK, owner, string.format('%d %s', left, deadline))
  else
    redis.call('hset', LOCK, owner, left)
  end
  return {RELEASED, left}
end
if state == 'read' then
  redis.call('hdel', LOCK, owner)
  redis.call('zrem', READERS, owner)
  -- The readers left keep it, with the longest lease among them; none left: free.
  state = rw_state(now)
else
  local reads = redis.call('hget', LOCK, owner .. ':r')
  if reads then
    local lease = math.max(1, redis.call('pttl', LOCK))
    redis.call('hdel', LOCK, owner .. ':r')
    redis.call('hset', LOCK, 'mode', 'read', owner, string.format('%s %d', reads, now + lease))
    redis.call('zadd', READERS, now + lease, owner)
    rw_readers_follow_hash()
    state = 'read'
  else
    redis.call('del', LOCK)
    state = nil
  end
end
rw_grant(now, state)
return {RELEASED, 0}
