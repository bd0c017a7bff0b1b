-- Release holds of an exclusive (or fair) lock; when the last goes, the first live waiter
-- gets the lock.
-- SCOPE: 'one' (one hold) or 'all' (every hold, and the owner's place in the queue: an
-- acquisition nobody saw, or shutdown).
-- Replies: {RELEASED, holds left}, or {NOT_HELD} when the owner held nothing. The last
-- release of a lock nobody waits for answers 0 alone, which stands for {RELEASED, 0}: Redis
-- builds and sends a table at about a tenth of an uncontended acquire and release.

-- 1. Every hold at once, the last release of a lock: most releases end here. An exclusive
-- lock has one owner, so removing its field and the two that say someone may wait (see
-- queue.lua) removes the lock (Redis drops an empty hash), and nothing else needs writing
-- when nobody waits. The count says whether this owner held it (odd) and whether anyone may
-- wait (2 or more).
local released
if SCOPE == 'all' then
  local removed = redis.call('hdel', LOCK, OWNER, 'queued', 'queued.2')
  released = removed % 2 == 1
  if removed < 2 then
    if released then
      return 0
    end
    if redis.call('exists', QUEUE) == 0 then
      return {NOT_HELD}
    end
  elseif not released and redis.call('exists', LOCK) == 1 then
    -- Another owner's lock: it keeps saying so.
    redis.call('hset', LOCK, 'queued', '1', 'queued.2', '1')
  end
end

-- The functions of the slower paths are created only when a script runs this far.
--#include clock
--#include tokens
--#include queue_expiry
--#include queue

-- 2. Someone may wait.
if SCOPE == 'all' then
  if not released then
    -- An acquisition nobody saw may have left this owner queued.
    dequeue(OWNER)
    return {NOT_HELD}
  end
  -- A holder is never queued: taking the lock took it out of the queue.
  grant_live_head(nil)
  return {RELEASED, 0}
end

-- 3. One hold.
local count = redis.call('hget', LOCK, OWNER)
if not count then
  return {NOT_HELD}
end
local left = tonumber(count) - 1
if left > 0 then
  redis.call('hset', LOCK, OWNER, left)
  return {RELEASED, left}
end
-- An exclusive lock has one owner: its last hold frees the lock.
redis.call('del', LOCK)
grant_head(nil)
return {RELEASED, 0}
