-- Claim the current tick of a schedule for the holder of its lock (`Schedule`): the tick is
-- the server's time over PERIOD_MS, never a client's clock, and TICKS keeps the last tick
-- claimed, '<tick> <claim>', where CLAIM is the caller's id for this one claim. The holder
-- holds while LOCK has OWNER among its fields (see guarded_write.lua).
-- A tick runs at most once: a claim of a tick at or before the last one claimed runs
-- nothing, unless it is the same claim sent twice (redis-rs sends a script again on a
-- cluster after a dropped connection), which gets the answer it got first.
-- With no record, the tick may have run in a life of the data that was lost (a restart
-- without persistence, a flush): only a tick that began after the data's life began
-- (EPOCH's first number, the server µs when it was found, see epoch.lua) is run; an earlier
-- one is recorded and not run.
-- MODE 'settle' records the current tick without running it (ticks a running job overran).
-- Replies: {RUN, tick, ticks passed over since the last claimed, server ms}; {SETTLED, the
-- same} for 'settle'; {DONE, tick, 0, server ms} when the tick was claimed already;
-- {UNKNOWN, tick, 0, server ms} when it may have run before a loss of data; {REFUSED} when the
-- owner does not hold the lock.

--#include clock

if redis.call('hexists', LOCK, OWNER) == 0 then
  return {REFUSED}
end
local now = now_ms()
local period = tonumber(PERIOD_MS)
local tick = math.floor(now / period)
local record = redis.call('get', TICKS)
local last, by
if record then
  last, by = string.match(record, '^(%d+) (%S+)$')
  last = tonumber(last)
end
if last and last >= tick then
  if last == tick and by == CLAIM then
    return {RUN, tick, 0, now}
  end
  return {DONE, tick, 0, now}
end
local claimed = string.format('%d %s', tick, CLAIM)
if not last then
  local epoch = redis.call('get', EPOCH)
  local born = epoch and tonumber(string.match(epoch, '^(%d+)'))
  if not born or born > tick * period * 1000 then
    redis.call('set', TICKS, claimed)
    return {UNKNOWN, tick, 0, now}
  end
end
redis.call('set', TICKS, claimed)
local passed = last and tick - last - 1 or 0
if MODE == 'settle' then
  return {SETTLED, tick, passed, now}
end
return {RUN, tick, passed, now}
