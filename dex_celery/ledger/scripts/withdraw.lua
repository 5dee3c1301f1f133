-- withdraw.lua: the worker holding `fence` hands its claimed attempt back before any tool code,
-- because the call must wait for a person again: the approval it carries is not bound to the
-- tool or the arguments this worker has (a deploy changed the tool between the approval and the
-- claim; docs/guardrails.md, "Approvals bound to what was approved"). The entry is removed, so
-- the next approval opens the call afresh; nothing was run and nothing is recorded as an
-- outcome. Replies kind = withdrawn | noop (the attempt is not this worker's running one).
local call, queue, lease_idx, close_idx = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local key, attempt, fence = ARGV[1], ARGV[2], ARGV[3]

local f = redis.call('HMGET', call, 'status', 'n', 'state', 'fence')
if f[1] ~= 'active' or f[2] ~= attempt or f[3] ~= 'running' or f[4] ~= fence then
  return {'kind', 'noop'}
end
redis.call('DEL', call)
redis.call('ZREM', queue, key)
redis.call('ZREM', lease_idx, key)
redis.call('ZREM', close_idx, key)
return {'kind', 'withdrawn'}
