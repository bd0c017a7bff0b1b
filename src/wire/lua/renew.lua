-- Renew the leases of many locks in one call (the watchdog's batch; with no locks, a check of
-- the epoch alone), on a lease of LEASE_MS, after checking the epoch (the one the client
-- knows is KNOWN_EPOCH, with KNOWN_LONGEST_LEASE_MS; QUARANTINE_MS is the quarantine to
-- start on a missing epoch). Per item: the lock's hash, its readers' index, and its owner.
-- An owner's field holds its hold count; a reader of a read-write lock's holds
-- '<holds> <lease deadline ms>' (see rw.lua), and a semaphore's holder
-- '<permits> <lease deadline ms> <token>' (see semaphore.lua): its own deadline moves, in the
-- hash and in the readers' index, and the keys' expiry only ever grows, as other holders may
-- have longer leases.
-- Replies: {RENEWED, then per lock HELD when renewed and GONE when that owner no longer
-- holds it}, or {EPOCH_CHANGED, epoch, longest lease ms} when the client must learn them (a
-- changed epoch: every lock of an earlier epoch is gone). A quarantine renews nothing less:
-- the locks it finds are of this epoch.

--#include clock
--#include saves
--#include life
--#include promotion
--#include epoch

local changed = check_epoch(EPOCH, KNOWN_EPOCH, KNOWN_LONGEST_LEASE_MS, QUARANTINE_MS,
  LEASE_MS, nil, RESTART_KEEPS_WRITES)
if changed and changed[1] == EPOCH_CHANGED then
  return changed
end
local lease = tonumber(LEASE_MS)
local renewed, now = {RENEWED}, nil
for n, hash, readers, owner in each_item() do
  local holds = redis.call('hget', hash, owner)
  local count, deadline, token
  if holds then
    count, deadline, token = string.match(holds, '^(%d+) (%d+)( ?%d*)$')
  end
  if not holds then
    renewed[n + 1] = GONE
  elseif not deadline then
    redis.call('pexpire', hash, LEASE_MS)
    renewed[n + 1] = HELD
  else
    now = now or now_ms()
    if tonumber(deadline) > now then
      redis.call('hset', hash, owner, string.format('%s %d%s', count, now + lease, token))
      redis.call('zadd', readers, now + lease, owner)
      if redis.call('pttl', hash) < lease then
        redis.call('pexpire', hash, lease)
        redis.call('pexpire', readers, lease)
      end
      renewed[n + 1] = HELD
    else
      -- Its lease ran out: the next script that looks at the lock drops it.
      renewed[n + 1] = GONE
    end
  end
end
return renewed
