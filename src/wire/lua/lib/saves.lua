-- When the server last saved its data (or started), in whole seconds of its clock (LASTSAVE):
-- a restart always moves it, and so does every snapshot. Read once per script (once per call
-- of a script run per item: a call runs at one instant, between two saves or before both).
local server_saved
local function last_save()
  if not server_saved then
    server_saved = redis.call('lastsave')
  end
  return server_saved
end
