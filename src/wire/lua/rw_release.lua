-- Release holds of a read-write lock; when the lock comes free (or only readers are left),
-- the queue gets it: one writer, or the run of readers at its head together.
-- SCOPE: 'all' (every hold of the role, and the owner's place in the queue: the last
-- release of an acquisition, one nobody saw, or shutdown), 'partial' (one hold, never the
-- last: the acquisition's other guards still hold it, so a run sent twice cannot free it)
-- or 'one' (one read hold within the write lock, whose owner's other read holds are other
-- acquisitions': KEEP says how many of them the client still needs); ROLE: the role of the
-- holds, 'read' or 'write'. A writer whose last write hold goes while it still has read
-- holds keeps the lock for reading (a downgrade), with what its lease had left.
-- Replies: {RELEASED, holds of the role left}, or {NOT_HELD} when the owner held none.

--#include release_trace
--#include clock
--#include counter
--#include tokens
--#include queue_expiry
--#include queue
--#include rw

local owner, scope, role = OWNER, SCOPE, ROLE
-- An owner's read holds within its write lock go apart from its write holds.
local releaser = owner .. ' ' .. role
if scope == 'all' then
  dequeue(owner)
end
local now = now_ms()
local state = rw_state(now)
local held = state and redis.call('hget', LOCK, owner)
-- What is left of `holds` after the release.
local function one_less(holds)
  if scope == 'all' then
    return 0
  elseif scope == 'partial' then
    return math.max(holds - 1, 1)
  end
  -- 'one': the read holds within the write lock that the owner's guards still need (KEEP,
  -- counted by the client) stay, whatever Redis counted; with none needed, none stays.
  local keep = tonumber(KEEP)
  if keep == 0 then
    return 0
  end
  return math.max(holds - 1, keep)
end
-- What a release that finds nothing to release answers.
local function not_held()
  if released_before(releaser) then
    return {RELEASED, 0}
  end
  return {NOT_HELD}
end

if not held or (role == 'write' and state == 'read') then
  -- Not held (a lease that ran out, or a write guard of an owner that downgraded); the
  -- lock may have come free meanwhile, and then the queue gets it.
  if state == nil or state == 'read' then
    rw_grant(now, state)
  end
  return not_held()
end
if role == 'read' and state == 'write' then
  -- The read holds the writer took inside its write lock.
  local reads = tonumber(redis.call('hget', LOCK, owner .. READS_WITHIN_SUFFIX))
  if not reads then
    return not_held()
  end
  local left = one_less(reads)
  if left > 0 then
    redis.call('hset', LOCK, owner .. READS_WITHIN_SUFFIX, left)
  else
    redis.call('hdel', LOCK, owner .. READS_WITHIN_SUFFIX)
    leave_release_trace(releaser)
  end
  return {RELEASED, left}
end
local holds, deadline = string.match(held, '^(%d+) ?(%d*)$')
local left = one_less(tonumber(holds))
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
  local reads = redis.call('hget', LOCK, owner .. READS_WITHIN_SUFFIX)
  if reads then
    local lease = math.max(1, redis.call('pttl', LOCK))
    redis.call('hdel', LOCK, owner .. READS_WITHIN_SUFFIX)
    redis.call('hset', LOCK, MODE_FIELD, MODE_READ, owner, string.format('%s %d', reads, now + lease))
    redis.call('zadd', READERS, now + lease, owner)
    rw_readers_follow_hash()
    state = 'read'
  else
    redis.call('del', LOCK)
    state = nil
  end
end
leave_release_trace(releaser)
rw_grant(now, state)
return {RELEASED, 0}
