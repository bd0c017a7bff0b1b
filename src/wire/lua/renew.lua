-- Renew the leases of many locks in one call (the watchdog's batch; with no locks, a check of
-- the epoch alone).
-- KEYS[1] the epoch key, KEYS[i] for i > 1 the lock hashes; ARGV[1] lease in ms, ARGV[2] the
-- epoch this client knows, ARGV[3] the quarantine ms to start on a missing epoch, ARGV[4]
-- the longest lease of the epoch this client knows, ARGV[i + 3] the owner id of KEYS[i].
-- An owner's field holds its hold count; a reader of a read-write lock's holds
-- '<holds> <lease deadline ms>' (see rw.lua): its own deadline moves, and the hash's expiry
-- only ever grows, as other readers may have longer leases.
-- Returns {0, then per lock 1 when renewed and 0 when that owner no longer holds it}, or
-- {epoch, longest lease} when the client must learn them (a changed epoch: every lock of an
-- earlier epoch is gone).
local changed = check_epoch(KEYS[1], ARGV[2], ARGV[4], ARGV[3], ARGV[1])
if changed and changed[1] == -2 then
  return {changed[2], changed[3]}
end
local lease = tonumber(ARGV[1])
local renewed, now = {0}, nil
for i = 2, #KEYS do
  local owner = ARGV[i + 3]
  local holds = redis.call('hget', KEYS[i], owner)
  local count, deadline
  if holds then
    count, deadline = string.match(holds, '^(%d+) (%d+)$')
  end
  if not holds then
    renewed[i] = 0
  elseif not deadline then
    redis.call('pexpire', KEYS[i], ARGV[1])
    renewed[i] = 1
  else
    now = now or now_ms()
    if tonumber(deadline) > now then
      redis.call('hset', KEYS[i], owner, string.format('%s %d', count, now + lease))
      if redis.call('pttl', KEYS[i]) < lease then
        redis.call('pexpire', KEYS[i], lease)
      end
      renewed[i] = 1
    else
      -- Its lease ran out: the next script that looks at the lock drops it.
      renewed[i] = 0
    end
  end
end
return renewed
