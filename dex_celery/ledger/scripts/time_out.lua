-- time_out.lua: a running attempt past its start-to-close deadline is fenced (S5.1).
-- KEYS[1] call hash  KEYS[2] queue index  KEYS[3] lease index  KEYS[4] start-to-close index
-- KEYS[5] unrecorded index
-- ARGV[1] key  ARGV[2] attempt n ('' = the current one)  ARGV[3] now  ARGV[4] jitter  ARGV[5] detail
-- The old worker cannot be stopped; clearing the fence makes its heartbeat report `cancelled`
-- and turns whatever it finishes into a late result. Returns {'noop'} or the next step.
local now = tonumber(ARGV[3])
local f = redis.call('HMGET', KEYS[1], 'status', 'n', 'state', 'close')
local n = ARGV[2]
if n == '' then n = f[2] end
if f[1] ~= 'active' or f[2] ~= n or f[3] ~= 'running' or tonumber(f[4]) > now then
  return {'noop'}
end
log_attempt(KEYS[1], n, 'timed_out', now)
redis.call('HSET', KEYS[1], 'state', 'timed_out', 'fence', '')
return next_step(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], now, 'timed_out',
  ARGV[5], ARGV[4])
