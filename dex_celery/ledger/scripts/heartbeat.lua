-- heartbeat.lua: renew the leases of every attempt one worker process runs, in one call.
-- KEYS[1] lease index  KEYS[2..N+1] call hashes
-- ARGV[1] now  then for each call i: ARGV[2i] its key, ARGV[2i+1] its fence
-- Returns the 1-based positions of calls whose attempt is no longer this one (fenced: timed
-- out, lost, or finished); their tools see `cancelled` and stop renewing.
local now = tonumber(ARGV[1])
local fenced = {}
for i = 2, #KEYS do
  local key = ARGV[2 * (i - 1)]
  local fence = ARGV[2 * (i - 1) + 1]
  local f = redis.call('HMGET', KEYS[i], 'state', 'fence', 'hb')
  if f[1] == 'running' and f[2] == fence then
    local lease = now + tonumber(f[3])
    redis.call('HSET', KEYS[i], 'lease', lease)
    redis.call('ZADD', KEYS[1], 'XX', lease, key)
  else
    table.insert(fenced, i - 1)
  end
end
return fenced
