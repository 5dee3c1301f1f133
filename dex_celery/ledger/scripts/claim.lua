-- claim.lua: the fact "attempt n reached a worker" (S3.3), before any tool code runs.
-- KEYS[1] call hash  KEYS[2] queue-deadline index  KEYS[3] lease index
-- KEYS[4] start-to-close index  KEYS[5] events stream
-- ARGV[1] key  ARGV[2] attempt n  ARGV[3] owner  ARGV[4] fence  ARGV[5] now
-- ARGV[6] events maxlen
-- Returns {1, heartbeat timeout, start-to-close} or {0, reason}. A refused claim is counted
-- in the field 'refused' so tests and operators can see stale deliveries being turned away.
-- The same claim repeated (same attempt and fence) succeeds again without changing anything.
local now = tonumber(ARGV[5])
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, 'unknown'}
end
local f = redis.call('HMGET', KEYS[1], 'status', 'n', 'state', 'deadline', 'hb', 's2c', 'fence')
if f[1] == 'active' and f[2] == ARGV[2] and f[3] == 'running' and f[7] == ARGV[4] then
  -- The same claim again (redis-py retries a command whose reply was lost): it holds already.
  return {1, f[5], f[6]}
end
local reason = nil
if f[1] ~= 'active' then
  reason = 'finished'
elseif f[2] ~= ARGV[2] then
  reason = 'stale_attempt'
elseif f[3] ~= 'enqueued' then
  reason = 'already_' .. f[3]
elseif tonumber(f[4]) < now then
  reason = 'expired'
end
if reason then
  redis.call('HINCRBY', KEYS[1], 'refused', 1)
  return {0, reason}
end
local lease = now + tonumber(f[5])
local close = now + tonumber(f[6])
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[3], 'fence', ARGV[4],
  'claimed_at', now, 'lease', lease, 'close', close, 'reached', 1)
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], lease, ARGV[1])
redis.call('ZADD', KEYS[4], close, ARGV[1])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*',
  'type', 'tool_call_started', 'key', ARGV[1], 'attempt', ARGV[2], 'owner', ARGV[3])
return {1, f[5], f[6]}
