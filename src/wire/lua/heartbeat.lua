-- Keep waiting owners' places in their queues alive: the watchdog's heartbeat, one call per
-- tick for the places of every lock this client waits for.
-- KEYS[2i - 1] and KEYS[2i] the queue and the waiters' terms of place i; ARGV[1] liveness ms;
-- ARGV[i + 1] the owner id of place i.
-- Returns per place 1 when it is still queued (its liveness now runs from the server's
-- clock), 0 when it is not (granted meanwhile, or dropped as dead).
local alive = tonumber(ARGV[1])
local now = now_ms()
local kept = {}
for i = 1, #ARGV - 1 do
  local queue, waiters, owner = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1]
  local terms = redis.call('hget', waiters, owner)
  local rest = terms and string.match(terms, '^%d+ (.*)$')
  if rest and redis.call('zscore', queue, owner) then
    redis.call('hset', waiters, owner, string.format('%d %s', now + alive, rest))
    keep_queue(queue, waiters, alive)
    kept[i] = 1
  else
    kept[i] = 0
  end
end
return kept
