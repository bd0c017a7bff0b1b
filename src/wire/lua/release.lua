-- Release holds of an exclusive (or fair) lock; when the last goes, the first live waiter
-- gets the lock.
-- SCOPE: 'all' (every hold, and the owner's place in the queue: the last release of an
-- acquisition, one nobody saw, or shutdown) or 'partial' (one hold, never the last: the
-- owner's other guards still hold the lock, so the count never goes below 1, and a run
-- sent twice cannot free it).
-- Replies: {RELEASED, holds left}, or {NOT_HELD} when the owner held nothing. The last
-- release of a lock nobody waits for answers 0 alone, which stands for {RELEASED, 0}: Redis
-- builds and sends a table at about a tenth of an uncontended acquire and release.

-- 1. Every hold at once, the last release of a lock: most releases end here. An exclusive
-- lock has one owner, so removing its field and the two that say someone may wait (see
-- queue.lua) removes the lock (Redis drops an empty hash), and nothing else needs writing
-- when nobody waits (on one server; a cluster leaves a trace, see release_trace.lua). The
-- count says whether this owner held it (odd) and whether anyone may wait (2 or more).
-- A lock left marked with no holder is one whose holder released it by plain commands and
-- found it marked (see wire/scripts/plain_release.rs): its grant is this call's, or was lost
-- with that holder's connection or given up, and any release grants it now.
local released, may_wait, marked_unheld
local tracing = RELEASE_TRACE_MS ~= '0'
if SCOPE == 'all' then
  local removed = redis.call('hdel', LOCK, OWNER, QUEUED_FIELD, QUEUED_SECOND_FIELD)
  released, may_wait = removed % 2 == 1, removed >= 2
  if removed < 2 and not tracing then
    if released then
      return 0
    end
    if redis.call('exists', QUEUE) == 0 then
      return {NOT_HELD}
    end
  elseif may_wait and not released then
    if redis.call('exists', LOCK) == 1 then
      -- Another owner's lock: it keeps saying so.
      redis.call('hset', LOCK, QUEUED_FIELD, '1', QUEUED_SECOND_FIELD, '1')
    else
      marked_unheld = true
    end
  end
end

-- The functions of the slower paths are created only when a script runs this far.
--#include release_trace
--#include clock
--#include counter
--#include tokens
--#include queue_expiry
--#include queue

-- 2. Someone may wait, or a cluster's release.
if SCOPE == 'all' then
  if not released then
    -- An acquisition nobody saw may have left this owner queued.
    dequeue(OWNER)
    if marked_unheld then
      grant_live_head(nil)
    end
    if released_before(OWNER) then
      return {RELEASED, 0}
    end
    return {NOT_HELD}
  end
  leave_release_trace(OWNER)
  -- A holder is never queued: taking the lock took it out of the queue.
  if may_wait then
    grant_live_head(nil)
  end
  return {RELEASED, 0}
end

-- 3. One hold of several.
local count = redis.call('hget', LOCK, OWNER)
if not count then
  if released_before(OWNER) then
    return {RELEASED, 0}
  end
  return {NOT_HELD}
end
local left = math.max(tonumber(count) - 1, 1)
redis.call('hset', LOCK, OWNER, left)
return {RELEASED, left}
