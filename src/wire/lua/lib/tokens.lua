-- Fencing tokens, and taking a lock found free. Uses LOCK (owner id -> hold count, and the
-- two fields of queue.lua), LAST_GRANT (the last token block granted from the queue) and
-- TOKEN_COUNTER (the counter of the lock's scope: the server, or the cluster slot); needs
-- the clock.

-- Reserves up to `block` fencing tokens and returns the first and how many were reserved:
-- one for the acquisition, the rest for the local hand-overs its instance may make without
-- coming back to Redis. Every token of every lock in the scope is reserved in one counter that
-- never expires, and starts past both that counter and the server clock in microseconds:
-- - the counter keeps tokens growing whatever any server's clock does (a step back of any
--   size, a restart or a promoted replica or a migrated slot with a clock behind) for as long
--   as Redis keeps its data: it is written, replicated and persisted with the grant, and
--   moves with its slot;
-- - the clock keeps them growing when the counter went back or is gone (a failover to a
--   replica that missed the last reservations, a restart without persistence), because the
--   counter is never more than tokens_ahead_us ahead of the clock: a block is cut to what
--   fits below that bound (down to the acquisition's own token), so a scope that reserves
--   faster than the clock runs gets fewer local hand-overs, not tokens from the future.
-- The block is written past the clock and the counter read back in the same SET: only a
-- counter already past the clock (a clock that went back, or a reservation within the last
-- few milliseconds) costs a second write.
local tokens_ahead_us = 2000

local function next_tokens(block)
  local now = now_us()
  local first = now + 1
  local counter = redis.call('set', TOKEN_COUNTER, string.format('%d', first + block - 1), 'get')
  counter = tonumber(counter or '0')
  if counter >= first then
    first = counter + 1
    block = math.max(1, math.min(block, now + tokens_ahead_us - counter))
    redis.call('set', TOKEN_COUNTER, string.format('%d', first + block - 1))
  end
  return first, block
end

-- The last token reserved in the scope (0 before the first): what a waiter's look reads, so
-- that a grant it hears of later is known to come after that look only when its first token
-- is above this one. The server's clock cannot tell: a clock that stepped back between a grant
-- and a later look dates the grant after the look.
local function last_token()
  return tonumber(redis.call('get', TOKEN_COUNTER) or '0')
end

-- Reserves a block for a grant to `owner` that its waiter may find by a look: LAST_GRANT keeps
-- '<last token of the block> <first token> <owner>' for `ttl_ms`, the grant's lease (a look
-- reads it back, and takes it only when it names the owner that looks). `ttl_ms` is best
-- given as a string (see `take`). Returns the first token and how many were reserved.
local function reserve_tokens(block, ttl_ms, owner)
  local first, reserved = next_tokens(block)
  redis.call('set', LAST_GRANT, string.format('%d %d %s', first + reserved - 1, first, owner),
    'px', ttl_ms)
  return first, reserved
end

-- Makes `owner` the holder of a lock found free with nobody queued, and returns its first
-- token and how many were reserved. Nothing else is written: the block of an earlier grant
-- in LAST_GRANT names its own owner, so a look by this one never takes it.
local function take_free(owner, lease_ms, block)
  redis.call('hset', LOCK, owner, '1')
  redis.call('pexpire', LOCK, lease_ms)
  return next_tokens(block)
end
