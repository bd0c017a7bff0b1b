-- Renew the leases of many locks in one call (the watchdog's batch).
-- KEYS the lock hashes; ARGV[1] lease in ms, ARGV[i + 1] the owner id of KEYS[i]
-- Returns, per key, 1 when renewed and 0 when that owner no longer holds the lock.
local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.call('hexists', key, ARGV[i + 1]) == 1 then
    redis.call('pexpire', key, ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
