-- The server's clock (prepended to every script that reads it): Redis time, never a client's.

-- Read once per script: a script runs at one instant, and a hand-over that dates a grant and
-- then reserves its tokens asks Redis for the time once, not twice.
local server_time
local function time()
  if not server_time then
    server_time = redis.call('time')
  end
  return server_time
end

local function now_ms()
  local t = time()
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function now_us()
  local t = time()
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

