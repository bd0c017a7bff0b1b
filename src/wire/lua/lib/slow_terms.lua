-- The terms only the slower paths of an acquisition read, split from the one argument they
-- travel in (SLOW_TERMS, see `SlowTerms`): how long a place in the queue lives without a
-- refresh, the epoch the client knows and the longest lease it knows was granted in it, the
-- quarantine to start on a missing epoch, and whether a restart keeps every write ('yes').
-- A lock taken at once never gets here, and pays for none of them.
local alive_ms, known_epoch, known_lease_ms, quarantine_ms, keeps_writes =
  string.match(SLOW_TERMS, '^(%d+) (%d+) (%d+) (%d+) (%a+)$')
