-- Acquire a lock, or re-enter one this owner holds.
-- KEYS[1] the lock hash (field = owner id, value = hold count), KEYS[2] the fencing counter
-- ARGV[1] lease in ms, ARGV[2] owner id, ARGV[3] '1' to re-enter only (never take a free lock)
-- Returns {1, token} when taken ({1, 0} on a re-entry), {0, pttl} while another owner holds
-- it, {-1, 0} when a re-entry finds the lock no longer held by this owner.
local owner = ARGV[2]
if redis.call('exists', KEYS[1]) == 0 then
  if ARGV[3] == '1' then
    return {-1, 0}
  end
  local token
  if redis.call('exists', KEYS[2]) == 1 then
    token = redis.call('incr', KEYS[2])
  else
    -- First use, or Redis lost its data: start at the server time in microseconds, which is
    -- past every token handed out before (one key never sees a million grants a second).
    local now = redis.call('time')
    token = redis.call('incrby', KEYS[2], now[1] .. string.format('%06d', tonumber(now[2])))
  end
  redis.call('hset', KEYS[1], owner, 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {1, token}
end
if redis.call('hexists', KEYS[1], owner) == 1 then
  -- A re-entry adds a hold and keeps the current lease.
  redis.call('hincrby', KEYS[1], owner, 1)
  return {1, 0}
end
if ARGV[3] == '1' then
  return {-1, 0}
end
return {0, redis.call('pttl', KEYS[1])}
