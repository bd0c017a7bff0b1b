-- Run a holder's writes only while it holds the lock (`LockGuard::write_if_held`). It holds
-- it while LOCK has OWNER among its fields: the hash expires with the lease, so a lease run
-- out, a force-unlock, another owner or a loss of data all leave the field out. A read-write
-- lock must be write-held too (see rw.lua): 'mode' is 'write', or absent for a plain lock,
-- where a reader's field would stand beside 'read'. Only then does each write run, per item
-- its key, its command and how many of the arguments after the items' it takes.
-- On a cluster a script may run twice (redis-rs sends it again after a dropped connection):
-- the writes' first run leaves WRITTEN, a key of this write alone, for WRITTEN_MS, and a
-- second run finds it and writes nothing again. 0 (one server) leaves and reads nothing.
-- Replies: {APPLIED} when every write ran, {REFUSED} when the owner does not hold the lock
-- (nothing was written).

local tracing = WRITTEN_MS ~= '0'
if tracing and redis.call('exists', WRITTEN) == 1 then
  return {APPLIED}
end
local mode = redis.call('hget', LOCK, MODE_FIELD)
if (mode and mode ~= MODE_WRITE) or redis.call('hexists', LOCK, OWNER) == 0 then
  return {REFUSED}
end
for _, key, command, arg_count in each_item() do
  redis.call(command, key, take_rest(tonumber(arg_count)))
end
if tracing then
  redis.call('set', WRITTEN, '1', 'px', WRITTEN_MS)
end
return {APPLIED}
