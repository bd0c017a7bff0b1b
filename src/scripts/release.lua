-- Release one hold of a lock, or every hold of one owner.
-- KEYS[1] the lock hash, KEYS[2] the release channel
-- ARGV[1] owner id, ARGV[2] 'all' to drop every hold of this owner, anything else for one
-- Returns the owner's remaining hold count, or -1 when the owner holds nothing.
local count = redis.call('hget', KEYS[1], ARGV[1])
if not count then
  return -1
end
local left = 0
if ARGV[2] ~= 'all' then
  left = tonumber(count) - 1
end
if left > 0 then
  redis.call('hset', KEYS[1], ARGV[1], left)
  return left
end
redis.call('hdel', KEYS[1], ARGV[1])
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('publish', KEYS[2], 'released')
end
return 0
