-- Run a holder's writes only while it holds the lock (`LockGuard::write_if_held`). It holds
-- it while LOCK has OWNER among its fields: the hash expires with the lease, so a lease run
-- out, a force-unlock, another owner or a loss of data all leave the field out. A read-write
-- lock must be write-held too (see rw.lua): 'mode' is 'write', or absent for a plain lock,
-- where a reader's field would stand beside 'read'. Only then does each write run, per item
-- its key, its command and how many of the arguments after the items' it takes.
-- Replies: {APPLIED} when every write ran, {REFUSED} when the owner does not hold the lock
-- (nothing was written).

local mode = redis.call('hget', LOCK, 'mode')
if (mode and mode ~= 'write') or redis.call('hexists', LOCK, OWNER) == 0 then
  return {REFUSED}
end
for _, key, command, arg_count in each_item() do
  redis.call(command, key, take_rest(tonumber(arg_count)))
end
return {APPLIED}
