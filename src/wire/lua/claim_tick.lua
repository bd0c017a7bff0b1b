-- Claim the current tick of a schedule for the holder of its lock (`Schedule`): the tick is
-- the server's time over PERIOD_MS, never a client's clock, and TICKS keeps the last tick
-- claimed, '<tick> <claim> <life>', where CLAIM is the caller's id for this one claim and
-- life the epoch it was written in (EPOCH's first number, the server µs when the data's life
-- began, see epoch.lua). The holder holds while LOCK has OWNER among its fields (see
-- guarded_write.lua).
-- A tick runs at most once: a claim of a tick at or before the last one claimed runs
-- nothing, unless it is the same claim sent twice (redis-rs sends a script again on a
-- cluster after a dropped connection), which gets the answer it got first.
-- With no record, or one written in another life of the data (a restart without
-- persistence or from a snapshot, a flush: the record may have lost later claims), the tick
-- may have run in the life that was lost: only a tick that began after this life began is
-- run; an earlier one is recorded and not run.
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
local epoch = redis.call('get', EPOCH)
local born = epoch and string.match(epoch, '^(%d+)')
local record = redis.call('get', TICKS)
local last, by, life
if record then
  last, by, life = string.match(record, '^(%d+) (%S+) (%d+)$')
  last = tonumber(last)
end
if last and last >= tick then
  if last == tick and by == CLAIM then
    return {RUN, tick, 0, now}
  end
  return {DONE, tick, 0, now}
end
local claimed = string.format('%d %s %s', tick, CLAIM, born or '0')
if not last or life ~= born then
  if not born or tonumber(born) > tick * period * 1000 then
    redis.call('set', TICKS, claimed)
    return {UNKNOWN, tick, 0, now}
  end
end
redis.call('set', TICKS, claimed)
-- Ticks passed over are known only from a record of this life.
local passed = (last and life == born) and tick - last - 1 or 0
if MODE == 'settle' then
  return {SETTLED, tick, passed, now}
end
return {RUN, tick, passed, now}
