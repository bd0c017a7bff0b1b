-- Waive the restart quarantine (operators only): on a server known to be new, or once every
-- holder of a lock the server lost is known to have stopped. Gives a server without an epoch
-- its first one, with no quarantine, and a server restarted since its epoch's life was
-- recorded a new one (its holders are told their locks are gone, as after any loss); ends a
-- quarantine that runs. The life of the process is recorded either way.
-- Replies: {WAIVED} when a quarantine was waived or never started, {NONE_RAN} when none
-- ran.

--#include clock
--#include saves
--#include life

local current = redis.call('get', EPOCH)
local epoch, quarantine_until, longest, recorded
if current then
  epoch, quarantine_until, longest, recorded = string.match(current, '^(%d+) (%d+) (%d+)(.*)$')
end
local change, life
if epoch then
  change, life = life_change(recorded)
  redis.call('del', epoch_marker(EPOCH, epoch, longest, saved_of(recorded)))
end
if not epoch or change == 'restarted' then
  redis.call('set', EPOCH, string.format('%d 0 0%s', now_us(), life or life_now()))
  return {WAIVED}
end
local ran = quarantine_until ~= '0' and tonumber(quarantine_until) > now_ms()
redis.call('set', EPOCH, string.format('%s 0 %s%s', epoch, longest, life or recorded))
if ran then
  return {WAIVED}
end
return {NONE_RAN}
