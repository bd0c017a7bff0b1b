-- Release holds of a lock; when the last goes, the first live waiter gets the lock.
-- ARGV[2] owner id, ARGV[3] scope: 'one' (one hold), 'all' (every hold, and the owner's place in
-- the queue: an acquisition nobody saw, or shutdown), 'handoff' (the last hold while more
-- tasks of this instance wait: pass the lock to the first live waiter and queue ARGV[4]
-- behind it, or keep it with a fresh token block when nobody else waits);
-- ARGV[4] owner id queued for this instance's next task, ARGV[5] waiter liveness ms,
-- ARGV[6] claim lease ms, ARGV[7] token block size, ARGV[8] lease ms of a kept lock.
-- Returns {holds left, 0, 0}, or {-1, 0, 0} when the owner held nothing; 'handoff' returns
-- {0, 1, server time ms} when the lock was passed on, {1, 2, first token} when it was kept.
local owner, scope = ARGV[2], ARGV[3]
-- Whether anyone waits, asked once. Most locks have nobody queued: their release touches
-- neither the queue nor the clock.
local queued
if scope == 'all' then
  queued = anyone_queued()
  if queued then
    dequeue(owner)
  end
end
local count = redis.call('hget', KEYS[1], owner)
if not count then
  return {-1, 0, 0}
end
if scope == 'handoff' then
  local now = now_ms()
  local head = live_head(now)
  if not head then
    redis.call('pexpire', KEYS[1], ARGV[8])
    return {1, 2, reserve_tokens(tonumber(ARGV[7]), ARGV[8])}
  end
  redis.call('hdel', KEYS[1], owner)
  grant_live_head(now)
  enqueue(ARGV[4], now, tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
  return {0, 1, now}
end
local left = 0
if scope == 'one' then
  left = tonumber(count) - 1
end
if left > 0 then
  redis.call('hset', KEYS[1], owner, left)
  return {left, 0, 0}
end
-- An exclusive lock has one owner: its last hold frees the lock.
redis.call('del', KEYS[1])
if queued == nil then
  queued = anyone_queued()
end
if queued then
  grant_live_head(nil)
end
return {0, 0, 0}
