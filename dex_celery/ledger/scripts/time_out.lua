-- time_out.lua: a running attempt past its start-to-close deadline is fenced (S5.1).
-- attempt '' = the current one. The old worker cannot be stopped; clearing the fence makes its
-- heartbeat report `cancelled` and turns whatever it finishes into a late result.
-- Replies kind = noop or the next step of _common.lua.
local call, queue, lease_idx, close_idx = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local unrecorded, epoch_key, clock_key = KEYS[5], KEYS[6], KEYS[7]
local key, attempt, jitter, detail = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if is_stale(call, epoch_key) then
  drop_from_indexes(key, queue, lease_idx, close_idx)
  return {'kind', 'noop'}
end
local f = redis.call('HMGET', call, 'status', 'n', 'state', 'close')
if attempt == '' then attempt = f[2] end
local now = ledger_now(clock_key)
if f[1] ~= 'active' or f[2] ~= attempt or f[3] ~= 'running' or tonumber(f[4]) > now then
  return {'kind', 'noop'}
end
log_attempt(call, attempt, 'timed_out', now, detail)
redis.call('HSET', call, 'state', 'timed_out', 'fence', '')
return next_step(call, queue, lease_idx, close_idx, unrecorded, key, now, 'timed_out', detail,
  jitter)
