-- The server's clock: Redis time, never a client's.

-- Read once per script: a script runs at one instant, and a hand-over that dates a grant and
-- then reserves its tokens asks Redis for the time once, not twice. Kept in microseconds,
-- which a Lua number holds exactly (2^53 µs is 285 years).
local server_us
local function now_us()
  if not server_us then
    local t = redis.call('time')
    server_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return server_us
end

local function now_ms()
  return math.floor(now_us() / 1000)
end
