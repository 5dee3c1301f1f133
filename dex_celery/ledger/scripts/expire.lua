-- expire.lua: an attempt that never reached a worker (S4.2).
-- attempt '' = the current one. mode:
--   due          the sweeper saw the schedule-to-start deadline pass (re-checked here).
--   unpublished  the broker refused the message, so no worker can ever claim it.
-- Replies kind = noop or the next step of _common.lua.
local call, queue, lease_idx, close_idx = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local unrecorded, epoch_key, clock_key = KEYS[5], KEYS[6], KEYS[7]
local key, attempt, mode, jitter, detail = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if is_stale(call, epoch_key) then
  drop_from_indexes(key, queue, lease_idx, close_idx)
  return {'kind', 'noop'}
end
local f = redis.call('HMGET', call, 'status', 'n', 'state', 'deadline')
if attempt == '' then attempt = f[2] end
if f[1] ~= 'active' or f[2] ~= attempt or f[3] ~= 'enqueued' then
  return {'kind', 'noop'}
end
local now = ledger_now(clock_key)
if mode == 'due' and tonumber(f[4]) > now then
  return {'kind', 'noop'}
end
log_attempt(call, attempt, 'expired', now, detail)
redis.call('HSET', call, 'state', 'expired')
redis.call('ZREM', queue, key)
return next_step(call, queue, lease_idx, close_idx, unrecorded, key, now, 'not_reached',
  detail, jitter)
