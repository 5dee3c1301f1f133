-- _common.lua: helpers prepended to every ledger script. It reads no KEYS or ARGV of its own:
-- every key arrives as a function argument from the script that includes it.
--
-- One clock (docs/semantics.md, S10.1): every time a script compares or stores comes from
-- Redis's own TIME, never from the host that called the script, so skew between worker, sweeper
-- and requester hosts changes no outcome. `clock_key` may hold a frozen time: the unit tests set
-- it to move time by hand; no production code writes it. It lives in Redis, so every host still
-- reads the same clock.
--
-- Replies are self-describing: a flat list of field, value pairs that `ledger/protocol.py` decodes
-- in one place.
--
-- next_step decides, atomically with the move that ended the attempt, what happens to the call:
-- another attempt (read / idempotent_write with attempts left, S3.1) or a terminal outcome (S4).
-- Causes:
--   ok          the tool returned                      -> succeeded
--   tool_error  the tool reported a failure            -> failed with its message
--   retryable   the tool reported a transient failure  -> retry, else failed
--   not_reached the attempt never reached a worker     -> retry, else failed (did not run) or,
--               if an earlier attempt reached one, as for lost
--   lost        the worker stopped after the claim     -> retry, else failed (read) or
--               outcome_unknown (S4.3)
--   timed_out   past start-to-close, fenced (S5.1)     -> retry, else failed

local function ledger_now(clock_key)
  local frozen = redis.call('GET', clock_key)
  if frozen then
    return tonumber(frozen)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- A call hash written in an earlier life of the ledger (before Redis went back in time and the
-- epoch was rotated) is stale: its state may be older than what really happened, so no script
-- acts on it (docs/ledger.md, "Rollback"). A hash without an epoch field predates the field.
local function is_stale(call, epoch_key)
  local mine = redis.call('HGET', call, 'epoch')
  return mine ~= false and mine ~= redis.call('GET', epoch_key)
end

local function drop_from_indexes(key, queue, lease, close)
  redis.call('ZREM', queue, key)
  redis.call('ZREM', lease, key)
  redis.call('ZREM', close, key)
end

-- The attempt log is one JSON array per call (its one codec in Python is ledger/attempt_log.py).
local function log_attempt(call, n, state, now, detail)
  local f = redis.call('HMGET', call, 'owner', 'claimed_at', 'log')
  local entry = cjson.encode({
    attempt = tonumber(n), state = state, owner = f[1] or '',
    claimed_at = tonumber(f[2] or ''), ended_at = now, error = detail or ''})
  local log = f[3]
  if not log or log == '' then
    log = '[' .. entry .. ']'
  else
    log = string.sub(log, 1, -2) .. ',' .. entry .. ']'
  end
  redis.call('HSET', call, 'log', log)
end

local function terminal(call, unrecorded, key, now, status, reason, detail)
  -- next_step has taken the key out of the lease and close indexes already.
  redis.call('HSET', call, 'status', status, 'reason', reason, 'error', detail,
    'finished_at', now, 'fence', '')
  redis.call('ZADD', unrecorded, now, key)
  local f = redis.call('HMGET', call, 'n', 'log')
  return {'kind', 'finished', 'status', status, 'reason', reason, 'attempt', f[1],
    'log', f[2] or '[]', 'detail', detail}
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
    -- The retry is published at once; its claim waits until not_before on Redis's clock, so a
    -- worker whose host clock differs neither runs it early nor lets it expire in the queue.
    local delay = math.min(tonumber(f[6]), tonumber(f[5]) * (2 ^ (n - 1))) * tonumber(jitter)
    local deadline = now + delay + tonumber(f[7])
    redis.call('HSET', call, 'n', n + 1, 'state', 'enqueued', 'deadline', deadline,
      'not_before', now + delay, 'owner', '', 'fence', '', 'claimed_at', '', 'lease', '',
      'close', '', 'last_cause', cause, 'last_detail', detail)
    redis.call('ZADD', queue, deadline, key)
    return {'kind', 'retry', 'attempt', tostring(n + 1), 'delay', tostring(delay)}
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
