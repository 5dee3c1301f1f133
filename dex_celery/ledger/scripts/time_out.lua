-- time_out.lua: a running attempt past its start-to-close deadline is fenced (S5.1).
-- attempt '' = the current one. The old worker cannot be stopped; clearing the fence makes its
-- heartbeat report `cancelled` and turns whatever it finishes into a late result.
-- Replies kind = noop or the next step of _common.lua.
local call, queue, lease_idx, close_idx = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local unrecorded, epoch_key, clock_key, running_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local key, attempt, jitter, detail, flags = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local c, frozen
c, attempt, frozen = live_call(call, key, attempt, epoch_key, clock_key, queue, lease_idx, close_idx)
if c == nil then return {'kind', 'noop'} end
local now = ledger_now(frozen)
if c.status ~= 'active' or c.n ~= attempt or c.state ~= 'running' or tonumber(c.close) > now then
  return {'kind', 'noop'}
end
local w = {}
log_attempt(w, c, attempt, 'timed_out', now, detail)
put(w, c, 'state', 'timed_out', 'fence', '')
-- The fenced tool may go on (S5.1): its running lease, in the same step, tells the repeat guard
-- (S5.4) until the worker's pump stops renewing it (the tool returned, or the worker died).
if running_key then
  local hb = tonumber(redis.call('HGET', call, 'hb')) or 5
  redis.call('SET', running_key, attempt, 'PX', math.max(1, math.floor(hb * 1000)))
end
local step = next_step(w, c, queue, lease_idx, close_idx, unrecorded, key, now, 'timed_out',
  detail, jitter, flags)
write_call(call, w)
return step
