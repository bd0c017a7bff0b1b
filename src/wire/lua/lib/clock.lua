-- The server's clock: Redis time, never a client's.

-- Read once per script: a script runs at one instant, and a hand-over that dates a grant and
-- then reserves its tokens asks Redis for the time once, not twice. Kept in microseconds,
-- which a Lua number holds exactly (2^53 µs is 285 years).
-- Its two strings are read by arithmetic, which converts a string once where `tonumber`
-- converts it twice (about 900 instructions of Redis's saved each); the scripts do so with
-- every string that is a number by construction (`+ 0`), and keep `tonumber` for what may
-- not be one.
local server_us
local function now_us()
  if not server_us then
    local t = redis.call('time')
    server_us = t[1] * 1000000 + t[2]
  end
  return server_us
end

local function now_ms()
  return math.floor(now_us() / 1000)
end
