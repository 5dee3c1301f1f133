-- lose.lua: the worker running an attempt stopped (S4.3).
-- KEYS[1] call hash  KEYS[2] queue index  KEYS[3] lease index  KEYS[4] start-to-close index
-- KEYS[5] unrecorded index
-- ARGV[1] key  ARGV[2] attempt n ('' = the current one)  ARGV[3] now  ARGV[4] mode  ARGV[5] jitter  ARGV[6] detail
-- mode 'lapsed': the sweeper saw the lease deadline pass; re-checked here, since a heartbeat
--   may have renewed it after the index was read.
-- mode 'worker_lost': the pool child died while its parent lives (Celery's WorkerLostError).
--   If it died before its claim the attempt never reached a worker and is expired instead.
-- Returns {'noop'} or the next step of _common.lua.
local now = tonumber(ARGV[3])
local f = redis.call('HMGET', KEYS[1], 'status', 'n', 'state', 'lease')
local n = ARGV[2]
if n == '' then n = f[2] end
if f[1] ~= 'active' or f[2] ~= n then
  return {'noop'}
end
if f[3] == 'running' then
  if ARGV[4] == 'lapsed' and tonumber(f[4]) > now then
    return {'noop'}
  end
  log_attempt(KEYS[1], n, 'lost', now)
  redis.call('HSET', KEYS[1], 'state', 'lost', 'fence', '')
  return next_step(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], now, 'lost',
    ARGV[6], ARGV[5])
end
if f[3] == 'enqueued' and ARGV[4] == 'worker_lost' then
  log_attempt(KEYS[1], n, 'expired', now)
  redis.call('HSET', KEYS[1], 'state', 'expired')
  redis.call('ZREM', KEYS[2], ARGV[1])
  return next_step(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], now, 'not_reached',
    ARGV[6], ARGV[5])
end
return {'noop'}
