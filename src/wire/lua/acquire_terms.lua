-- What an acquisition reads only when it waits or checks the epoch, sent as one argument: a
-- free lock taken at once reads none of it, and each argument costs Redis a Lua string and
-- room in ARGV. ARGV[7] is '<waiter liveness ms> <grant lease ms> <the epoch the client knows,
-- 0 for none> <the quarantine ms it starts on a missing epoch>'.
local alive_ms, grant_lease_ms, known_epoch, quarantine_ms =
  string.match(ARGV[7], '^(%d+) (%d+) (%d+) (%d+)$')
