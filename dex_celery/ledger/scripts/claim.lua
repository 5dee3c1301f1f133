-- claim.lua: the fact "attempt n reached a worker" (S3.3), before any tool code runs.
-- Replies kind = claimed (with the attempt's heartbeat timeout, start-to-close and effect
-- class), early (a retry whose backoff has not passed on Redis's clock: wait `wait` seconds and
-- claim again) or refused (with its reason). A refused claim is counted in the field 'refused'
-- so tests and operators can see stale deliveries being turned away. The same claim repeated
-- (same attempt and fence) succeeds again without changing anything.
local call, queue, lease_idx, close_idx = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local events, epoch_key, clock_key = KEYS[5], KEYS[6], KEYS[7]
local key, attempt, owner, fence, events_maxlen = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local f = redis.call('HMGET', call, 'status', 'n', 'state', 'deadline', 'hb', 's2c', 'fence',
  'not_before', 'effect', 'epoch')
if not f[1] then
  -- Every hash open.lua writes has a status: no status, no entry (or it expired).
  return {'kind', 'refused', 'reason', 'unknown'}
end
local claimed = {'kind', 'claimed', 'heartbeat_timeout', f[5], 'start_to_close', f[6],
  'effect', f[9]}
local epoch, frozen = ledger_globals(epoch_key, clock_key)
local reason = nil
if is_stale(f[10], epoch) then
  reason = 'stale_ledger'
elseif f[1] == 'active' and f[2] == attempt and f[3] == 'running' and f[7] == fence then
  -- The same claim again (redis-py retries a command whose reply was lost): it holds already.
  return claimed
elseif f[1] ~= 'active' then
  reason = 'finished'
elseif f[2] ~= attempt then
  reason = 'stale_attempt'
elseif f[3] ~= 'enqueued' then
  reason = 'already_' .. f[3]
end
local now = ledger_now(frozen)
if not reason and tonumber(f[4]) < now then
  reason = 'expired'
end
if reason then
  redis.call('HINCRBY', call, 'refused', 1)
  return {'kind', 'refused', 'reason', reason}
end
if f[8] and tonumber(f[8]) > now then
  return {'kind', 'early', 'wait', tostring(tonumber(f[8]) - now)}
end
local lease = now + tonumber(f[5])
local close = now + tonumber(f[6])
redis.call('HSET', call, 'state', 'running', 'owner', owner, 'fence', fence,
  'claimed_at', now, 'lease', lease, 'close', close, 'reached', 1)
redis.call('ZREM', queue, key)
redis.call('ZADD', lease_idx, lease, key)
redis.call('ZADD', close_idx, close, key)
redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*',
  'type', 'tool_call_started', 'key', key, 'attempt', attempt, 'owner', owner)
return claimed
