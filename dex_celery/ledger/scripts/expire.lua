-- expire.lua: an attempt that never reached a worker (S4.2).
-- attempt '' = the current one. mode:
--   due          the sweeper saw the schedule-to-start deadline pass (re-checked here).
--   unpublished  the broker refused the message, so no worker can ever claim it.
-- Replies kind = noop or the next step of _common.lua.
local call, queue, lease_idx, close_idx = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local unrecorded, epoch_key, clock_key = KEYS[5], KEYS[6], KEYS[7]
local key, attempt, mode, jitter, detail = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local flags = ARGV[6]

local c, frozen
c, attempt, frozen = live_call(call, key, attempt, epoch_key, clock_key, queue, lease_idx, close_idx)
if c == nil then return {'kind', 'noop'} end
if c.status ~= 'active' or c.n ~= attempt or c.state ~= 'enqueued' then
  return {'kind', 'noop'}
end
local now = ledger_now(frozen)
if mode == 'due' and tonumber(c.deadline) > now then
  return {'kind', 'noop'}
end
-- Why it waited, if a worker said so while handing it back (note.lua).
local waiting = redis.call('HMGET', call, 'waiting_n', 'waiting')
if waiting[1] == attempt and waiting[2] then
  detail = detail .. '; ' .. waiting[2]
end
local w = {}
log_attempt(w, c, attempt, 'expired', now, detail)
put(w, c, 'state', 'expired')
redis.call('ZREM', queue, key)
local step = next_step(w, c, queue, lease_idx, close_idx, unrecorded, key, now, 'not_reached',
  detail, jitter, flags)
write_call(call, w)
return step
