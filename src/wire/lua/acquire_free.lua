-- Acquire a lock, wait in its queue, or re-enter it. This first part runs before the epoch's
-- and the queue's functions are defined: a free lock nobody waits for, in the epoch the client
-- knows, is taken without them (acquire_checked.lua goes on from here).
-- ARGV[2] owner id, ARGV[3] lease ms, ARGV[4] mode: 'wait' (join or keep a place in the queue
-- when the lock is not free for this owner), 'join' (the same for an owner Redis has never
-- seen: it can hold nothing yet), 'try' (never queue), 'reenter' (add a hold, never take);
-- ARGV[5] token block size, ARGV[6] the longest lease of the epoch the client knows, ARGV[7]
-- the terms of waiting and of the epoch (see acquire_terms.lua); KEYS[6] the epoch key,
-- KEYS[7] the marker of the epoch and longest lease the client knows (see epoch.lua).
-- Returns {1, first token, lease left ms} when this owner holds the lock (token 0 on a
-- re-entry), {0, holder's lease left ms, server time ms} when it does not, {-1, 0, 0} when a
-- re-entry finds the lock no longer held by this owner, {-2, epoch, 0} when the client must
-- learn the epoch and its longest lease first ({-2, epoch, longest lease ms}), and {-3,
-- quarantine left ms, server time ms} during a quarantine. A free lock taken below returns
-- its first token alone (its lease left is the one asked for): an integer costs Redis less
-- to build and send than a table.
local owner, mode = ARGV[2], ARGV[4]
local block = tonumber(ARGV[5])
-- The lock, its queue, the epoch key and the marker in one call, counted 1, 1, 3 and 3 times:
-- the count leaves 0, 1 or 2 of the first two (neither exists for most acquisitions), and
-- 6 more when both of the others exist (3 when only one does). Keys moved for a migrating
-- slot are counted one EXISTS each: the importing node refuses a command on several keys it
-- lacks.
local seen
if keys_moved then
  seen = 0
  for _, key in ipairs({KEYS[1], KEYS[3], KEYS[6], KEYS[6], KEYS[6], KEYS[7], KEYS[7], KEYS[7]}) do
    seen = seen + redis.call('exists', key)
  end
else
  seen = redis.call('exists', KEYS[1], KEYS[3], KEYS[6], KEYS[6], KEYS[6],
    KEYS[7], KEYS[7], KEYS[7])
end
local present = seen % 3
-- The epoch the client knows is current, no quarantine runs, and this lease is no longer than
-- the longest the epoch has granted: nothing to read or write about the epoch. The client
-- writes both leases as plain decimals, which compare as numbers by length, then as strings,
-- and cheaper than `tonumber` (Lua's `strtod`) reads them.
local lease_text, longest_text = ARGV[3], ARGV[6]
local epoch_current = seen - present == 6 and (#lease_text < #longest_text
  or (#lease_text == #longest_text and lease_text <= longest_text))
if present == 0 and mode ~= 'reenter' and epoch_current then
  return take_free(owner, ARGV[3], block)
end
