-- Take permits of a semaphore, or wait for them in its queue.
-- The arguments and replies of acquire_free.lua, and ARGV[8] the semaphore's permit count,
-- ARGV[9] how many permits this owner takes. Every acquisition is an owner of its own, so
-- there is no re-entry ('reenter' and 'within' answer {-1, 0, 0}).
-- Also {-4, the permit count in Redis, 0} when the semaphore is held with another count
-- than this client's: nothing was taken, and a place an earlier look queued is given up.
local owner, mode = ARGV[2], ARGV[4]
if mode ~= 'wait' and mode ~= 'join' and mode ~= 'try' then
  return {-1, 0, 0}
end
local lease, block = tonumber(ARGV[3]), tonumber(ARGV[5])
local permits, take = tonumber(ARGV[8]), tonumber(ARGV[9])
local blocked = check_epoch(KEYS[6], known_epoch, ARGV[6], quarantine_ms, ARGV[3])
if blocked then
  return blocked
end
local now = now_ms()
local stored, used = sem_state(now)
if stored and stored ~= permits then
  dequeue(owner)
  return {-4, stored, 0}
end
-- An owner Redis has never seen ('join') holds nothing: only one that looked before may have
-- been granted permits meanwhile.
local held = stored and mode ~= 'join' and redis.call('hget', KEYS[1], owner)
if held then
  -- Granted from the queue while this waiter was not listening: its token was kept with its
  -- permits, as holders that came after it hold later ones.
  local deadline, token = string.match(held, '^%d+ (%d+) (%d+)$')
  return {1, tonumber(token), tonumber(deadline) - now}
end
local token, granted, waiting
token, granted, used, waiting = sem_grant(now, permits, used, owner, lease)
if token then
  return {1, token, granted}
end
-- Nobody queued ahead and enough permits free: taken. Nobody overtakes a live waiter.
if not waiting and used + take <= permits then
  return {1, sem_add(owner, now, lease, block, take, permits), lease}
end
if mode ~= 'try' then
  enqueue(owner, now, tonumber(alive_ms), tonumber(grant_lease_ms), block, tostring(take))
end
-- The first holder whose lease runs out may free permits.
local first = redis.call('zrange', HOLDERS, 0, 0, 'WITHSCORES')[2]
local left = -2
if first then
  left = math.max(1, tonumber(first) - now)
end
return {0, left, now}
