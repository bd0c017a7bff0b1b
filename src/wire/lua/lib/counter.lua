-- The fencing token counter of the lock's scope (TOKEN_COUNTER: the server, or the cluster
-- slot): reserving blocks of tokens, and the last token reserved. Uses no key of a lock of its
-- own, so a script run per item includes it once for all its items; needs the clock.

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
-- A script runs alone, so once it wrote the counter it knows the value: a second reservation
-- in the same run (the next item of a script run per item) writes past it without reading.
-- One whose tokens only the script's reply carries (`reply_only`: a lock taken free) does not
-- write it: a script run per item that takes locks free writes it once after its last item
-- (`catch_up_counter`), and its reply goes out only when it ran to its end, past that write.
-- A reservation whose tokens are written anywhere else (a grant's block, a wake message)
-- writes the counter at once, and so does the first of every run and every reservation of a
-- script run once, which writes nothing after its code.
local tokens_ahead_us = 2000
local counter_written
-- Whether TOKEN_COUNTER is behind counter_written: only reply_only reservations leave it so.
local counter_behind = false
-- Set by a script run per item whose items take locks free, after this library: it runs
-- catch_up_counter after its last item. A script without it writes every reservation at once.
local counter_caught_up_after_items = false

local function next_tokens(block, reply_only)
  local now = now_us()
  local first = now + 1
  if counter_written then
    first = math.max(now, counter_written) + 1
    block = math.max(1, math.min(block, now + tokens_ahead_us - (first - 1)))
    counter_written = first + block - 1
    if reply_only and counter_caught_up_after_items then
      counter_behind = true
    else
      redis.call('set', TOKEN_COUNTER, string.format('%d', counter_written))
      counter_behind = false
    end
    return first, block
  end
  local counter = redis.call('set', TOKEN_COUNTER, string.format('%d', first + block - 1), 'get')
  counter = (counter or 0) + 0
  if counter >= first then
    first = counter + 1
    block = math.max(1, math.min(block, now + tokens_ahead_us - counter))
    redis.call('set', TOKEN_COUNTER, string.format('%d', first + block - 1))
  end
  counter_written = first + block - 1
  return first, block
end

-- The last token reserved in the scope (0 before the first): what a waiter's look reads, so
-- that a grant it hears of later is known to come after that look only when its first token
-- is above this one. The server's clock cannot tell: a clock that stepped back between a grant
-- and a later look dates the grant after the look. Within a script run per item it may miss
-- tokens its earlier items took with locks free (not written yet): no grant carries those.
local function last_token()
  return (redis.call('get', TOKEN_COUNTER) or 0) + 0
end

-- Writes the counter past the tokens a script run per item reserved, after its last item, if
-- a reservation left it behind (see `next_tokens`).
local function catch_up_counter()
  if counter_behind then
    redis.call('set', TOKEN_COUNTER, string.format('%d', counter_written))
  end
end
