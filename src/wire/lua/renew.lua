-- Renew the leases of many locks in one call (the watchdog's batch; with no locks, a check of
-- the epoch alone).
-- KEYS[1] the epoch key, then for the n-th lock KEYS[2n] its hash and KEYS[2n + 1] its
-- readers' index; ARGV[1] lease in ms, ARGV[2] the epoch this client knows, ARGV[3] the
-- quarantine ms to start on a missing epoch, ARGV[4] the longest lease of the epoch this
-- client knows, ARGV[n + 4] the owner id of the n-th lock.
-- An owner's field holds its hold count; a reader of a read-write lock's holds
-- '<holds> <lease deadline ms>' (see rw.lua), and a semaphore's holder
-- '<permits> <lease deadline ms> <token>' (see sem.lua): its own deadline moves, in the hash
-- and in the readers' index, and the keys' expiry only ever grows, as other holders may have
-- longer leases.
-- Returns {0, then per lock 1 when renewed and 0 when that owner no longer holds it}, or
-- {epoch, longest lease} when the client must learn them (a changed epoch: every lock of an
-- earlier epoch is gone).
local changed = check_epoch(KEYS[1], ARGV[2], ARGV[4], ARGV[3], ARGV[1])
if changed and changed[1] == -2 then
  return {changed[2], changed[3]}
end
local lease = tonumber(ARGV[1])
local renewed, now = {0}, nil
for n = 1, (#KEYS - 1) / 2 do
  local hash, readers, i = KEYS[2 * n], KEYS[2 * n + 1], n + 1
  local owner = ARGV[n + 4]
  local holds = redis.call('hget', hash, owner)
  local count, deadline, token
  if holds then
    count, deadline, token = string.match(holds, '^(%d+) (%d+)( ?%d*)$')
  end
  if not holds then
    renewed[i] = 0
  elseif not deadline then
    redis.call('pexpire', hash, ARGV[1])
    renewed[i] = 1
  else
    now = now or now_ms()
    if tonumber(deadline) > now then
      redis.call('hset', hash, owner, string.format('%s %d%s', count, now + lease, token))
      redis.call('zadd', readers, now + lease, owner)
      if redis.call('pttl', hash) < lease then
        redis.call('pexpire', hash, lease)
        redis.call('pexpire', readers, lease)
      end
      renewed[i] = 1
    else
      -- Its lease ran out: the next script that looks at the lock drops it.
      renewed[i] = 0
    end
  end
end
return renewed
