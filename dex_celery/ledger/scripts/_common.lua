-- _common.lua: helpers prepended to every ledger script. It reads no KEYS or ARGV of its own:
-- every key arrives as a function argument from the script that includes it.
--
-- One clock (docs/semantics.md, S10.1): every time a script compares or stores comes from
-- Redis's own TIME, never from the host that called the script, so skew between worker, sweeper
-- and requester hosts changes no outcome. `clock_key` may hold a frozen time: the unit tests set
-- it to move time by hand; no production code writes it. It lives in Redis, so every host still
-- reads the same clock.
--
-- Cost (docs/benchmarks.md): every command a script runs is a command Redis executes per call, so
-- each script reads the call hash once (one HMGET of every field it needs, the epoch among them;
-- `read_call` for the scripts that end an attempt), reads the ledger's globals once
-- (`ledger_globals`, one MGET of the epoch in force and the frozen time), and writes the call
-- hash once (`put` collects field, value pairs; `write_call` sends them as one HSET). Scripts
-- keep `c`, the fields read, up to date as they change them, so later steps see what an HGET
-- after each write would have shown. Redis runs this text on every call of every script, so it
-- only defines functions; `recorded` and `rotate` use none of them and run without it.
--
-- Replies are self-describing: a flat list of field, value pairs that `ledger/protocol.py` decodes
-- in one place.
--
-- next_step decides, atomically with the move that ended the attempt, what happens to the call:
-- another attempt (a retried class with attempts left, S3.1) or a terminal outcome (S4).
-- Causes:
--   ok          the tool returned                      -> succeeded
--   tool_error  the tool reported a failure            -> failed with its message
--   retryable   the tool reported a transient failure  -> retry, else failed
--   not_reached the attempt never reached a worker     -> retry, else failed (did not run) or,
--               if an earlier attempt reached one, as for lost
--   lost        the worker stopped after the claim     -> retry, else the class's lost
--               status and reason (failed for a read, else outcome_unknown, S4.3)
--   timed_out   past start-to-close, fenced (S5.1)     -> retry, else failed
--   unconfirmed a write's worker could not commit its SQL claim and gave the attempt up before
--               any tool code                          -> outcome_unknown (claim_unconfirmed),
--               judged from SQL when it is recorded (the write fence, docs/ledger.md)

-- The epoch in force and the frozen time, in one read. The frozen time is nil in production
-- (nothing writes the key), so `ledger_now` then asks TIME.
local function ledger_globals(epoch_key, clock_key)
  local g = redis.call('MGET', epoch_key, clock_key)
  return g[1], g[2]
end

local function ledger_now(frozen)
  if frozen then
    return tonumber(frozen)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- The fields of the call hash that the scripts ending an attempt may need, as a table by name
-- (an absent field is false, as HMGET replies), in one HMGET. Built here rather than as a
-- table at the top, since the helpers' text runs on every call of every script.
local function read_call(call)
  local v = redis.call('HMGET', call, 'status', 'n', 'state', 'deadline', 'lease', 'close',
    'owner', 'fence', 'claimed_at', 'log', 'max', 'effect', 'reached', 'b0', 'bmax', 's2s',
    'epoch', 'done_fence', 'retry', 'lost', 'lost_reason')
  return {status = v[1], n = v[2], state = v[3], deadline = v[4], lease = v[5], close = v[6],
    owner = v[7], fence = v[8], claimed_at = v[9], log = v[10], max = v[11], effect = v[12],
    reached = v[13], b0 = v[14], bmax = v[15], s2s = v[16], epoch = v[17], done_fence = v[18],
    retry = v[19], lost = v[20], lost_reason = v[21]}
end

-- The effect flags of the call (docs/ledger.md, "Effect flags"): whether a failed attempt may be
-- retried, and the status and reason a lost attempt ends with. open.lua writes them into the
-- hash; a hash opened by a release before them has none, and `known` (the caller's effect table,
-- JSON: class -> [retry, lost, lost_reason]) says what its class means. A class neither knows is
-- run at most once and a lost attempt leaves its outcome unknown.
local function effect_flags(c, known)
  if c.retry then
    return c.retry == '1', c.lost, c.lost_reason
  end
  local row = nil
  if known and known ~= '' and c.effect then
    row = cjson.decode(known)[c.effect]
  end
  if row then
    return row[1] == '1', row[2], row[3]
  end
  return false, 'outcome_unknown', 'lost'
end

-- Queue field, value pairs for the one HSET of `write_call`, and keep `c` current.
local function put(w, c, ...)
  for i = 1, select('#', ...), 2 do
    local field, value = select(i, ...)
    w[#w + 1] = field
    w[#w + 1] = value
    c[field] = tostring(value)
  end
end

local function write_call(call, w)
  if #w > 0 then
    redis.call('HSET', call, unpack(w))
  end
end

-- A call hash written in an earlier life of the ledger (before Redis went back in time and the
-- epoch was rotated) is stale: its state may be older than what really happened, so no script
-- acts on it (docs/ledger.md, "Rollback"). A hash without an epoch field predates the field.
-- `mine` is the hash's epoch field, `current` the epoch in force (both false when absent).
local function is_stale(mine, current)
  return mine ~= false and mine ~= current
end

local function drop_from_indexes(key, queue, lease, close)
  redis.call('ZREM', queue, key)
  redis.call('ZREM', lease, key)
  redis.call('ZREM', close, key)
end

-- The attempt log is one JSON array per call (its one codec in Python is ledger/attempt_log.py).
-- The call hash of a transition script (expire, lose, time_out) in the ledger's current life,
-- with its attempt number ('' = the current one) and the frozen clock; nil after dropping the
-- call from the due-indexes when the hash belongs to an older life.
local function live_call(call, key, attempt, epoch_key, clock_key, queue, lease, close)
  local c = read_call(call)
  local epoch, frozen = ledger_globals(epoch_key, clock_key)
  if is_stale(c.epoch, epoch) then
    drop_from_indexes(key, queue, lease, close)
    return nil
  end
  if attempt == '' then attempt = c.n end
  return c, attempt, frozen
end

local function log_attempt(w, c, n, state, now, detail)
  local entry = cjson.encode({
    attempt = tonumber(n), state = state, owner = c.owner or '',
    claimed_at = tonumber(c.claimed_at or ''), ended_at = now, error = detail or ''})
  local log = c.log
  if not log or log == '' then
    log = '[' .. entry .. ']'
  else
    log = string.sub(log, 1, -2) .. ',' .. entry .. ']'
  end
  put(w, c, 'log', log)
end

local function terminal(w, c, unrecorded, key, now, status, reason, detail)
  -- next_step has taken the key out of the lease and close indexes already.
  put(w, c, 'status', status, 'reason', reason, 'error', detail, 'finished_at', now, 'fence', '')
  redis.call('ZADD', unrecorded, now, key)
  -- '%.17g', as HSET stored it: the worker records this reply's time, the sweeper and a waiting
  -- caller the hash's, and all must write the same `finished_at` (Lua's tostring keeps 14 digits).
  return {'kind', 'finished', 'status', status, 'reason', reason, 'attempt', c.n,
    'log', c.log or '[]', 'detail', detail, 'finished_at', string.format('%.17g', now)}
end

-- Decides the next step and queues its writes in `w`; the caller then runs `write_call`.
-- `flags` is the caller's effect table, for a hash without flags of its own (`effect_flags`).
local function next_step(w, c, queue, lease, close, unrecorded, key, now, cause, detail, jitter,
    flags)
  local n, max = tonumber(c.n), tonumber(c.max)
  local reached = c.reached == '1'
  local retryable_class, lost, lost_reason = effect_flags(c, flags)
  redis.call('ZREM', lease, key)
  redis.call('ZREM', close, key)
  if cause == 'ok' then
    return terminal(w, c, unrecorded, key, now, 'succeeded', 'ok', '')
  end
  if cause == 'tool_error' then
    return terminal(w, c, unrecorded, key, now, 'failed', 'tool_error', detail)
  end
  if cause == 'unconfirmed' then
    return terminal(w, c, unrecorded, key, now, 'outcome_unknown', 'claim_unconfirmed', detail)
  end
  if retryable_class and n < max then
    -- The retry is published at once; its claim waits until not_before on Redis's clock, so a
    -- worker whose host clock differs neither runs it early nor lets it expire in the queue.
    local delay = math.min(tonumber(c.bmax), tonumber(c.b0) * (2 ^ (n - 1))) * tonumber(jitter)
    local deadline = now + delay + tonumber(c.s2s)
    put(w, c, 'n', n + 1, 'state', 'enqueued', 'deadline', deadline,
      'not_before', now + delay, 'owner', '', 'fence', '', 'claimed_at', '', 'lease', '',
      'close', '', 'last_cause', cause, 'last_detail', detail)
    redis.call('ZADD', queue, deadline, key)
    return {'kind', 'retry', 'attempt', tostring(n + 1), 'delay', tostring(delay)}
  end
  if cause == 'retryable' then
    return terminal(w, c, unrecorded, key, now, 'failed', 'tool_error', detail)
  end
  if cause == 'timed_out' then
    return terminal(w, c, unrecorded, key, now, 'failed', 'timed_out', detail)
  end
  if cause == 'not_reached' and not reached then
    return terminal(w, c, unrecorded, key, now, 'failed', 'did_not_run', detail)
  end
  -- lost, or not_reached after an earlier attempt reached a worker: the tool may have run.
  return terminal(w, c, unrecorded, key, now, lost, lost_reason, detail)
end
