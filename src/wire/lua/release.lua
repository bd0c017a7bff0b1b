-- Release, continued (after release_free.lua and the queue's functions): someone may wait.
if scope == 'all' then
  if not released then
    -- An acquisition nobody saw may have left this owner queued.
    dequeue(owner)
    return {-1, 0, 0}
  end
  -- A holder is never queued: taking the lock took it out of the queue.
  grant_live_head(nil)
  return {0, 0, 0}
end
local count = redis.call('hget', KEYS[1], owner)
if not count then
  return {-1, 0, 0}
end
if scope == 'handoff' then
  local now = now_ms()
  local head, grant_lease, block = pop_live_head(now)
  if not head then
    redis.call('pexpire', KEYS[1], ARGV[8])
    return {1, 2, reserve_tokens(tonumber(ARGV[7]), ARGV[8], owner)}
  end
  redis.call('hdel', KEYS[1], owner)
  grant_to(head, now, grant_lease, block)
  enqueue(ARGV[4], now, tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
  return {0, 1, now}
end
local left = tonumber(count) - 1
if left > 0 then
  redis.call('hset', KEYS[1], owner, left)
  return {left, 0, 0}
end
-- An exclusive lock has one owner: its last hold frees the lock.
redis.call('del', KEYS[1])
grant_head(nil)
return {0, 0, 0}
