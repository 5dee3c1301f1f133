-- expire.lua: an attempt that never reached a worker (S4.2).
-- KEYS[1] call hash  KEYS[2] queue index  KEYS[3] lease index  KEYS[4] start-to-close index
-- KEYS[5] unrecorded index
-- ARGV[1] key  ARGV[2] attempt n ('' = the current one)  ARGV[3] now  ARGV[4] mode  ARGV[5] jitter  ARGV[6] detail
-- mode 'due': the sweeper saw the schedule-to-start deadline pass (re-checked here).
-- mode 'unpublished': the broker refused the message, so no worker can ever claim it.
-- Returns {'noop'} or the next step of _common.lua.
local now = tonumber(ARGV[3])
local f = redis.call('HMGET', KEYS[1], 'status', 'n', 'state', 'deadline')
local n = ARGV[2]
if n == '' then n = f[2] end
if f[1] ~= 'active' or f[2] ~= n or f[3] ~= 'enqueued' then
  return {'noop'}
end
if ARGV[4] == 'due' and tonumber(f[4]) > now then
  return {'noop'}
end
log_attempt(KEYS[1], n, 'expired', now)
redis.call('HSET', KEYS[1], 'state', 'expired')
redis.call('ZREM', KEYS[2], ARGV[1])
return next_step(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], now, 'not_reached',
  ARGV[6], ARGV[5])
