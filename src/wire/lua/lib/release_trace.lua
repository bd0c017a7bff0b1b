-- The trace of a release, on a cluster: redis-rs sends a script again on a fresh connection
-- when the first one dropped before its reply, so a release may run twice. Its second run
-- finds nothing of the owner left, and must not call that "not held". The release that
-- freed an owner's holds leaves who released them (the owner, and of a read-write lock the
-- role) behind for RELEASE_TRACE_MS (twice the command timeout: a second run comes while
-- the caller still waits, or never); a run that finds nothing reads it. 0 (one server,
-- whose connections never send a script twice) leaves and reads nothing.

-- Records that `who`'s holds were released just now.
local function leave_release_trace(who)
  if RELEASE_TRACE_MS ~= '0' then
    redis.call('set', RELEASE_TRACE, who, 'px', RELEASE_TRACE_MS)
  end
end

-- Whether `who`'s holds were released by an earlier run of this very release.
local function released_before(who)
  return RELEASE_TRACE_MS ~= '0' and redis.call('get', RELEASE_TRACE) == who
end
