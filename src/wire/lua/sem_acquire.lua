-- Take permits of a semaphore (TAKE of its PERMITS), or wait for them in its queue.
-- MODE: as acquire.lua's. Every acquisition is an owner of its own, so there is no re-entry
-- ('reenter' and 'within' answer {NOT_OWNER}).
-- Replies: as acquire.lua's, and {PERMITS_MISMATCH, the permit count in Redis} when the
-- semaphore is held with another count than this client's: nothing was taken, and a place
-- an earlier look queued is given up.

--#include clock
--#include saves
--#include counter
--#include tokens
--#include life
--#include promotion
--#include epoch
--#include queue_expiry
--#include queue
--#include semaphore
--#include slow_terms

local owner, mode = OWNER, MODE
if mode ~= 'wait' and mode ~= 'join' and mode ~= 'try' then
  return {NOT_OWNER}
end
local lease, block = tonumber(LEASE_MS), tonumber(TOKEN_BLOCK)
local permits, asked = tonumber(PERMITS), tonumber(TAKE)
local blocked = check_epoch(EPOCH, known_epoch, known_lease_ms, quarantine_ms, LEASE_MS, nil,
  keeps_writes)
if blocked then
  return blocked
end
local now = now_ms()
local stored, used = sem_state(now)
if stored and stored ~= permits then
  dequeue(owner)
  return {PERMITS_MISMATCH, stored}
end
-- An owner Redis has never seen ('join') holds nothing: only one that looked before may have
-- been granted permits meanwhile.
local held = stored and mode ~= 'join' and redis.call('hget', LOCK, owner)
if held then
  -- Granted from the queue while this waiter was not listening: its token was kept with its
  -- permits, as holders that came after it hold later ones.
  local deadline, token = string.match(held, '^%d+ (%d+) (%d+)$')
  return {ACQUIRED, tonumber(token), tonumber(deadline) - now}
end
local token, granted, waiting
token, granted, used, waiting = sem_grant(now, permits, used, owner, lease)
if token then
  return {ACQUIRED, token, granted}
end
-- Nobody queued ahead and enough permits free: taken. Nobody overtakes a live waiter.
if not waiting and used + asked <= permits then
  return {ACQUIRED, sem_add(owner, now, lease, block, asked, permits), lease}
end
-- An owner that queues is told the last token reserved (see `last_token`); one that does not,
-- or that Redis has never seen ('join', see acquire.lua's step 6), 0.
local last = 0
if mode ~= 'try' then
  enqueue(owner, now, alive_ms + 0, lease, block, tostring(asked))
  if mode ~= 'join' then
    last = last_token()
  end
end
-- The first holder whose lease runs out may free permits.
local first = redis.call('zrange', HOLDERS, 0, 0, 'WITHSCORES')[2]
local left = -2
if first then
  left = math.max(1, tonumber(first) - now)
end
return {WAITING, left, now, last}
