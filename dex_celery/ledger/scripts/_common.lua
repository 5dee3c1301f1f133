-- _common.lua: helpers prepended to the transition scripts that end an attempt
-- (finish, lose, expire, time_out). It reads no KEYS or ARGV of its own: every key arrives as
-- a function argument from the script that includes it.
--
-- next_step decides, atomically with the move that ended the attempt, what happens to the
-- call: another attempt (read / idempotent_write with attempts left, S3.1) or a terminal
-- outcome (S4). Causes:
--   ok          the tool returned                      -> succeeded
--   tool_error  the tool reported a failure            -> failed with its message
--   retryable   the tool reported a transient failure  -> retry, else failed
--   not_reached the attempt never reached a worker     -> retry, else failed (did not run) or,
--               if an earlier attempt reached one, as for lost
--   lost        the worker stopped after the claim     -> retry, else failed (read) or
--               outcome_unknown (S4.3)
--   timed_out   past start-to-close, fenced (S5.1)     -> retry, else failed

local function log_attempt(call, n, state, now)
  local owner = redis.call('HGET', call, 'owner') or ''
  local claimed = redis.call('HGET', call, 'claimed_at') or ''
  redis.call('HSET', call, 'log', (redis.call('HGET', call, 'log') or '') ..
    n .. '|' .. state .. '|' .. owner .. '|' .. claimed .. '|' .. now .. ';')
end

local function terminal(call, unrecorded, key, now, status, reason, detail)
  -- next_step has taken the key out of the lease and close indexes already.
  redis.call('HSET', call, 'status', status, 'reason', reason, 'error', detail,
    'finished_at', now, 'fence', '')
  redis.call('ZADD', unrecorded, now, key)
  local f = redis.call('HMGET', call, 'n', 'log')
  return {'finished', status, reason, f[1], f[2] or '', detail}
end

local function next_step(call, queue, lease, close, unrecorded, key, now, cause, detail, jitter)
  local f = redis.call('HMGET', call, 'n', 'max', 'effect', 'reached', 'b0', 'bmax', 's2s')
  local n, max, effect = tonumber(f[1]), tonumber(f[2]), f[3]
  local reached = f[4] == '1'
  local retryable_class = effect == 'read' or effect == 'idempotent_write'
  redis.call('ZREM', lease, key)
  redis.call('ZREM', close, key)
  if cause == 'ok' then
    return terminal(call, unrecorded, key, now, 'succeeded', 'ok', '')
  end
  if cause == 'tool_error' then
    return terminal(call, unrecorded, key, now, 'failed', 'tool_error', detail)
  end
  if retryable_class and n < max then
    local delay = math.min(tonumber(f[6]), tonumber(f[5]) * (2 ^ (n - 1))) * tonumber(jitter)
    local deadline = now + delay + tonumber(f[7])
    redis.call('HSET', call, 'n', n + 1, 'state', 'enqueued', 'deadline', deadline,
      'owner', '', 'fence', '', 'claimed_at', '', 'lease', '', 'close', '',
      'last_cause', cause, 'last_detail', detail)
    redis.call('ZADD', queue, deadline, key)
    return {'retry', tostring(n + 1), tostring(delay)}
  end
  if cause == 'retryable' then
    return terminal(call, unrecorded, key, now, 'failed', 'tool_error', detail)
  end
  if cause == 'timed_out' then
    return terminal(call, unrecorded, key, now, 'failed', 'timed_out', detail)
  end
  if cause == 'not_reached' and not reached then
    return terminal(call, unrecorded, key, now, 'failed', 'did_not_run', detail)
  end
  -- lost, or not_reached after an earlier attempt reached a worker: the tool may have run.
  if effect == 'read' then
    return terminal(call, unrecorded, key, now, 'failed', 'lost', detail)
  end
  return terminal(call, unrecorded, key, now, 'outcome_unknown', 'lost', detail)
end
