-- finish.lua: the attempt's own end, reported by the worker that claimed it.
-- KEYS[1] call hash  KEYS[2] queue index  KEYS[3] lease index  KEYS[4] start-to-close index
-- KEYS[5] unrecorded index  KEYS[6] events stream
-- ARGV[1] key  ARGV[2] attempt n  ARGV[3] fence  ARGV[4] now
-- ARGV[5] cause: ok | tool_error | retryable | timed_out (the soft time limit fired)  ARGV[6] payload (result JSON or error text)
-- ARGV[7] jitter in [0, 1)  ARGV[8] events maxlen
-- Moves running -> succeeded/failed (or to the next attempt) only while the fence matches;
-- otherwise the payload is kept as a late result and announced (S5.2), never as the outcome.
-- A result reported after the start-to-close deadline counts as a time-out, with the payload
-- kept as a late result; the step then ends with the marker 'late_result'.
-- The fence that finished is kept in 'done_fence', so a repeat of the same finish is {'noop'}.
local now = tonumber(ARGV[4])
local f = redis.call('HMGET', KEYS[1], 'state', 'n', 'fence')
if f[1] ~= 'running' or f[2] ~= ARGV[2] or f[3] ~= ARGV[3] then
  if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'done_fence') == ARGV[3] then
    -- The same finish again (redis-py retries a command whose reply was lost): it was applied
    -- already; it is neither a late result nor a second outcome.
    return {'noop'}
  end
  if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('HSET', KEYS[1], 'late', cjson.encode({attempt = tonumber(ARGV[2]),
      cause = ARGV[5], payload = ARGV[6], at = now}))
  end
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[8], '*',
    'type', 'tool_call_late_result', 'key', ARGV[1], 'attempt', ARGV[2], 'cause', ARGV[5])
  return {'late'}
end
local cause, detail = ARGV[5], ARGV[6]
local converted = false
local close = tonumber(redis.call('HGET', KEYS[1], 'close'))
if cause ~= 'timed_out' and close and now > close then
  -- Finished after its start-to-close deadline but before the sweeper fenced it: the timeout
  -- stands, and what the tool returned is evidence only (S5.1, S5.2).
  redis.call('HSET', KEYS[1], 'late', cjson.encode({attempt = tonumber(ARGV[2]),
    cause = ARGV[5], payload = ARGV[6], at = now}))
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[8], '*',
    'type', 'tool_call_late_result', 'key', ARGV[1], 'attempt', ARGV[2], 'cause', ARGV[5])
  cause, detail = 'timed_out', 'the tool finished after its start-to-close deadline'
  converted = true
end
local state = 'failed'
if cause == 'ok' then
  state = 'succeeded'
elseif cause == 'timed_out' then
  state = 'timed_out'
end
log_attempt(KEYS[1], ARGV[2], state, now)
redis.call('HSET', KEYS[1], 'state', state, 'done_fence', ARGV[3])
if cause == 'ok' then
  redis.call('HSET', KEYS[1], 'result', ARGV[6])
end
local step = next_step(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], now, cause,
  detail, ARGV[7])
if converted then
  table.insert(step, 'late_result')
end
return step
