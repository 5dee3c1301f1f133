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
local jitter, events_maxlen, flags = ARGV[6], ARGV[7], ARGV[8]

local c = read_call(call)
local epoch, frozen = ledger_globals(epoch_key, clock_key)
local now = ledger_now(frozen)
local w = {}
local function keep_late()
  local late = cjson.encode({attempt = tonumber(attempt), cause = cause, payload = payload,
    at = now})
  if c.status then
    put(w, c, 'late', late)
  end
  redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*',
    'type', 'tool_call_late_result', 'key', key, 'attempt', attempt, 'cause', cause)
end

if c.state ~= 'running' or c.n ~= attempt or c.fence ~= fence or is_stale(c.epoch, epoch) then
  if fence ~= '' and c.done_fence == fence then
    -- The same finish again (redis-py retries a command whose reply was lost): it was applied
    -- already; it is neither a late result nor a second outcome.
    return {'kind', 'noop'}
  end
  keep_late()
  write_call(call, w)
  return {'kind', 'late'}
end
local detail = payload
local late_result = '0'
local close = tonumber(c.close)
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
log_attempt(w, c, attempt, state, now, detail)
put(w, c, 'state', state, 'done_fence', fence)
if cause == 'ok' then
  put(w, c, 'result', payload)
end
local step = next_step(w, c, queue, lease_idx, close_idx, unrecorded, key, now, cause, detail,
  jitter, flags)
write_call(call, w)
if step[2] == 'finished' then
  -- The ledger holds the outcome now; its SQL record follows in the recorder's next batch
  -- (tool_call_finished). A waiting caller learns the outcome from this event (S7.3).
  redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*',
    'type', 'tool_call_ended', 'key', key, 'status', step[4])
end
table.insert(step, 'late_result')
table.insert(step, late_result)
return step
