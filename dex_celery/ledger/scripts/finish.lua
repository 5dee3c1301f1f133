-- finish.lua: the attempt's own end, reported by the worker that claimed it.
-- cause: ok | tool_error | retryable | timed_out (the soft time limit fired) | lost (the tool's
-- own link to its service broke after the call went out: it may have taken effect); payload is
-- the result JSON or the error text.
-- Moves running -> succeeded/failed (or to the next attempt) only while the fence matches;
-- otherwise the payload is kept as a late result and announced (S5.2), never as the outcome.
-- A result reported after the start-to-close deadline counts as a time-out, with the payload
-- kept as a late result; the step then carries late_result = 1.
-- The fence that finished is kept in 'done_fence', so a repeat of the same finish is a noop.
local call, queue, lease_idx, close_idx = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local unrecorded, events, epoch_key, clock_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local key, attempt, fence, cause, payload = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local jitter, events_maxlen = ARGV[6], ARGV[7]

local now = ledger_now(clock_key)
local function keep_late()
  if redis.call('EXISTS', call) == 1 then
    redis.call('HSET', call, 'late', cjson.encode({attempt = tonumber(attempt),
      cause = cause, payload = payload, at = now}))
  end
  redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*',
    'type', 'tool_call_late_result', 'key', key, 'attempt', attempt, 'cause', cause)
end

local f = redis.call('HMGET', call, 'state', 'n', 'fence', 'close')
if f[1] ~= 'running' or f[2] ~= attempt or f[3] ~= fence or is_stale(call, epoch_key) then
  if fence ~= '' and redis.call('HGET', call, 'done_fence') == fence then
    -- The same finish again (redis-py retries a command whose reply was lost): it was applied
    -- already; it is neither a late result nor a second outcome.
    return {'kind', 'noop'}
  end
  keep_late()
  return {'kind', 'late'}
end
local detail = payload
local late_result = '0'
local close = tonumber(f[4])
if cause ~= 'timed_out' and close and now > close then
  -- Finished after its start-to-close deadline but before the sweeper fenced it: the timeout
  -- stands, and what the tool returned is evidence only (S5.1, S5.2).
  keep_late()
  cause, detail = 'timed_out', 'the tool finished after its start-to-close deadline'
  late_result = '1'
end
local state = 'failed'
if cause == 'ok' then
  state = 'succeeded'
  detail = ''
elseif cause == 'timed_out' or cause == 'lost' then
  state = cause
end
log_attempt(call, attempt, state, now, detail)
redis.call('HSET', call, 'state', state, 'done_fence', fence)
if cause == 'ok' then
  redis.call('HSET', call, 'result', payload)
end
local step = next_step(call, queue, lease_idx, close_idx, unrecorded, key, now, cause, detail,
  jitter)
table.insert(step, 'late_result')
table.insert(step, late_result)
return step
