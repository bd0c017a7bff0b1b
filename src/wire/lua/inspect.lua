-- Read one lock as Redis holds it, at one instant, for operators; writes nothing.
-- MAX_WAITERS: the most queued owners to read, from the head (at least 1).
-- Replies {server time ms, {hash field, value, ...}, the hash's PTTL, the last grant's block
-- ('<last token> <owner>', '' when gone), how many are queued, {owner, arrival (server µs),
-- terms ('' when none), ...}, the last leader a singleton recorded ('<term> <since ms>
-- <owner>', '' when none, see record_leader.lua)}.

--#include clock

local queued = redis.call('zcard', QUEUE)
local waiters = {}
if queued > 0 then
  local head = redis.call('zrange', QUEUE, 0, tonumber(MAX_WAITERS) - 1, 'WITHSCORES')
  for i = 1, #head, 2 do
    waiters[#waiters + 1] = head[i]
    waiters[#waiters + 1] = head[i + 1]
    waiters[#waiters + 1] = redis.call('hget', WAITER_TERMS, head[i]) or ''
  end
end
return {now_ms(), redis.call('hgetall', LOCK), redis.call('pttl', LOCK),
  redis.call('get', LAST_GRANT) or '', queued, waiters, redis.call('get', LEADER) or ''}
