-- Read one lock as Redis holds it, at one instant, for operators (after clock.lua); writes
-- nothing.
-- KEYS[1] the lock hash, KEYS[2] the last token block granted, KEYS[3] the queue, KEYS[4]
-- the waiters' terms; ARGV[1] the most queued owners to read, from the head (at least 1).
-- Returns {server time ms, {hash field, value, ...}, the hash's PTTL, the last grant's block
-- ('<last token> <owner>', '' when gone), how many are queued, {owner, arrival (server µs),
-- terms ('' when none), ...}}.
local queued = redis.call('zcard', KEYS[3])
local waiters = {}
if queued > 0 then
  local head = redis.call('zrange', KEYS[3], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
  for i = 1, #head, 2 do
    waiters[#waiters + 1] = head[i]
    waiters[#waiters + 1] = head[i + 1]
    waiters[#waiters + 1] = redis.call('hget', KEYS[4], head[i]) or ''
  end
end
return {now_ms(), redis.call('hgetall', KEYS[1]), redis.call('pttl', KEYS[1]),
  redis.call('get', KEYS[2]) or '', queued, waiters}
