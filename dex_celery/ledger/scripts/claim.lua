-- claim.lua: the fact "attempt n reached a worker" (S3.3), before any tool code runs.
-- Replies kind = claimed (with the attempt's heartbeat timeout, start-to-close and effect
-- class), early (a retry whose backoff has not passed on Redis's clock: wait `wait` seconds and
-- claim again) or refused (with its reason). A refused claim is counted in the field 'refused'
-- so tests and operators can see stale deliveries being turned away. The same claim repeated
-- (same attempt and fence) succeeds again without changing anything.
--
-- The write freeze (docs/semantics.md, S13.2): `freeze_key` is the shard's copy of the freezes
-- in force, one JSON object (tool name or '*' -> id, mode, classes, reason, by, since), read in
-- the same MGET as the epoch and the frozen time, so a claim costs no extra command. A claim that would
-- succeed, of a call whose class the freeze names, for tool `tool` or every tool, is answered
-- kind = frozen instead (with the freeze's JSON and whether an earlier attempt reached a worker)
-- and the entry leaves the ledger, as a call waiting for a person has none (S6.1): the worker
-- then holds the call in SQL, or rejects it. So once `writes freeze` has written the hash, no
-- write starts. A call a person approved after the freeze began (`passed`, the approval's time,
-- written by open.lua) is the person's decision and is claimed. An older caller passes no tool
-- (nil): only a freeze of every tool applies to it.
local call, queue, lease_idx, close_idx = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local events, epoch_key, clock_key, freeze_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local key, attempt, owner, fence, events_maxlen = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local tool = ARGV[6] or '*'

local f = redis.call('HMGET', call, 'status', 'n', 'state', 'deadline', 'hb', 's2c', 'fence',
  'not_before', 'effect', 'epoch', 'passed', 'reached')
if not f[1] then
  -- Every hash open.lua writes has a status: no status, no entry (or it expired).
  return {'kind', 'refused', 'reason', 'unknown'}
end
local claimed = {'kind', 'claimed', 'heartbeat_timeout', f[5], 'start_to_close', f[6],
  'effect', f[9]}
-- ledger_globals' MGET, with the freezes (an older caller passes no freeze key: read the epoch
-- twice rather than add a command).
local g = redis.call('MGET', epoch_key, clock_key, freeze_key or epoch_key)
local epoch, frozen, freezes = g[1], g[2], freeze_key and g[3]
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
if freezes then
  local all = cjson.decode(freezes)
  local e = all[tool] or all['*']
  if e then
    local frozen = false
    for _, class in ipairs(e.classes) do
      if class == f[9] then
        frozen = true
      end
    end
    if frozen and not (f[11] and tonumber(f[11]) >= tonumber(e.since)) then
      redis.call('DEL', call)
      redis.call('ZREM', queue, key)
      redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*',
        'type', 'tool_call_frozen', 'key', key, 'attempt', attempt, 'freeze', tostring(e.id))
      return {'kind', 'frozen', 'freeze', cjson.encode(e), 'reached', f[12] or '0',
        'effect', f[9]}
    end
  end
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
