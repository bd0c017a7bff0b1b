-- Keep waiting owners' places in their queues alive: the watchdog's heartbeat, one call per
-- tick for the places of every lock this client waits for, each kept ALIVE_MS from the
-- server's clock. Per item: the queue, the waiters' terms, and the owner.
-- Replies: per place QUEUED when it is still queued, NOT_QUEUED when it is not (granted
-- meanwhile, or dropped as dead).

--#include clock
--#include queue_expiry

local alive = tonumber(ALIVE_MS)
local now = now_ms()
local kept = {}
for n, queue, waiters, owner in each_item() do
  local terms = redis.call('hget', waiters, owner)
  local rest = terms and string.match(terms, '^%d+ (.*)$')
  if rest and redis.call('zscore', queue, owner) then
    redis.call('hset', waiters, owner, string.format('%d %s', now + alive, rest))
    keep_queue(queue, waiters, alive)
    kept[n] = QUEUED
  else
    kept[n] = NOT_QUEUED
  end
end
return kept
