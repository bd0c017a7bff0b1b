-- Renew the leases of many locks in one call (the watchdog's batch; with no locks, a check of
-- the epoch alone).
-- KEYS[1] the epoch key, KEYS[i] for i > 1 the lock hashes; ARGV[1] lease in ms, ARGV[2] the
-- epoch this client knows, ARGV[3] the quarantine ms to start when Redis lost its data,
-- ARGV[i + 2] the owner id of KEYS[i].
-- Returns {0, then per lock 1 when renewed and 0 when that owner no longer holds it}, or
-- {epoch} when the epoch changed: every lock of an earlier epoch is gone.
local changed = check_epoch(KEYS[1], ARGV[2], ARGV[3])
if changed and changed[1] == -2 then
  return {changed[2]}
end
local renewed = {0}
for i = 2, #KEYS do
  if redis.call('hexists', KEYS[i], ARGV[i + 2]) == 1 then
    redis.call('pexpire', KEYS[i], ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
