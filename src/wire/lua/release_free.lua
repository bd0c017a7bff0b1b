-- Release holds of a lock; when the last goes, the first live waiter gets the lock.
-- ARGV[2] owner id, ARGV[3] scope: 'one' (one hold), 'all' (every hold, and the owner's place in
-- the queue: an acquisition nobody saw, or shutdown), 'handoff' (the last hold while more
-- tasks of this instance wait: pass the lock to the first live waiter and queue ARGV[4]
-- behind it, or keep it with a fresh token block when nobody else waits);
-- ARGV[4] owner id queued for this instance's next task, ARGV[5] waiter liveness ms,
-- ARGV[6] grant lease ms, ARGV[7] token block size, ARGV[8] lease ms of a kept lock.
-- Returns {holds left, 0, 0}, or {-1, 0, 0} when the owner held nothing ('all' below returns
-- the first figure alone: an integer costs Redis less to build and send than a table);
-- 'handoff' returns {0, 1, server time ms} when the lock was passed on, {1, 2, first token}
-- when it was kept.
-- This first part runs before any function is defined: the last release of a lock nobody
-- waits for needs none (release.lua goes on from here).
local owner, scope = ARGV[2], ARGV[3]
local released
if scope == 'all' then
  -- An exclusive lock has one owner: removing its field and the two that say someone may
  -- wait (see queue.lua) removes the lock (Redis drops an empty hash). The count says
  -- whether this owner held it (odd) and whether anyone may wait (2 or more).
  local removed = redis.call('hdel', KEYS[1], owner, 'queued', 'queued.2')
  released = removed % 2 == 1
  if removed < 2 then
    if released or redis.call('exists', KEYS[3]) == 0 then
      return released and 0 or -1
    end
  elseif not released and redis.call('exists', KEYS[1]) == 1 then
    -- Another owner's lock: it keeps saying so.
    redis.call('hset', KEYS[1], 'queued', '1', 'queued.2', '1')
  end
end
