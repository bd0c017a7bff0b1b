-- Look at this server's promotion, and vouch for it (see promotion.lua): SETTLED lists
-- (comma-separated) the replication ids the caller saw on a master for VOUCHED_MS by its own
-- monotonic clock.
-- Replies: {NOT_PROMOTED, ''} when this server is no master with a previous replication id;
-- {SEEN, id} when it is one under `id`, which SETTLED does not list; {VOUCHED, id} when
-- SETTLED lists it and WITNESS says so (written now, if it said less).

--#include promotion

local replication = redis.call('info', 'replication')
local id = string.match(replication, 'master_replid:(%x+)')
if not id or not string.find(replication, 'role:master', 1, true)
  or not was_promoted(replication) then
  return {NOT_PROMOTED, ''}
end
if SETTLED == '' or not string.find(SETTLED, id, 1, true) then
  return {SEEN, id}
end
if vouched_ms(redis.call('get', WITNESS), id) < tonumber(VOUCHED_MS) then
  redis.call('set', WITNESS, id .. ' ' .. VOUCHED_MS)
end
return {VOUCHED, id}
