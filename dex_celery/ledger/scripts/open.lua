-- open.lua: create a call's ledger entry with attempt 1 enqueued.
-- KEYS[1] call hash   KEYS[2] queue-deadline index   KEYS[3] epoch   KEYS[4] events stream
-- ARGV[1] key  ARGV[2] expected epoch  ARGV[3] now  ARGV[4] effect  ARGV[5] max attempts
-- ARGV[6] backoff initial  ARGV[7] backoff max  ARGV[8] schedule-to-start
-- ARGV[9] start-to-close  ARGV[10] heartbeat timeout  ARGV[11] events maxlen
-- ARGV[12] '1' to announce tool_call_requested
-- ARGV[13] '1' if an earlier ledger, since lost, may have handed the call to a worker (the
--   sweeper reopening a call after Redis lost its data): its attempts then count as having
--   reached one, so running out of them is never reported as "did not run" (S4.2, S4.3).
--   Optional; absent means '0'.
-- Returns {'opened'} | {'exists'} | {'epoch'} (the ledger is not the one the caller knows:
-- Redis lost its data or was replaced).
if redis.call('GET', KEYS[3]) ~= ARGV[2] then
  return {'epoch'}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'exists'}
end
local now = tonumber(ARGV[3])
local deadline = now + tonumber(ARGV[8])
redis.call('HSET', KEYS[1], 'status', 'active', 'n', 1, 'state', 'enqueued',
  'deadline', deadline, 'effect', ARGV[4], 'max', ARGV[5], 'b0', ARGV[6], 'bmax', ARGV[7],
  's2s', ARGV[8], 's2c', ARGV[9], 'hb', ARGV[10], 'reached', ARGV[13] == '1' and 1 or 0,
  'opened_at', now)
redis.call('ZADD', KEYS[2], deadline, ARGV[1])
if ARGV[12] == '1' then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[11], '*',
    'type', 'tool_call_requested', 'key', ARGV[1], 'effect', ARGV[4])
end
return {'opened'}
