-- lose.lua: the worker running an attempt stopped, or gave the attempt up (S4.3).
-- attempt '' = the current one. mode:
--   lapsed      the sweeper saw the lease deadline pass; re-checked here, since a heartbeat may
--               have renewed it after the index was read.
--   worker_lost a pool process died while its parent lives (Celery's WorkerLostError). Only the
--               attempt that process claimed is lost: `owner` must be the one in the hash (a
--               duplicate delivery that died before its claim must not end another process's
--               running attempt). If the attempt is still enqueued, it never reached a worker
--               and is expired instead.
--   released    the worker holding `fence` gives the attempt up before running any tool code,
--               because the system of record refused its claim (another claim of this write
--               exists there, or the call has ended there): the tool may have run elsewhere.
-- Replies kind = noop or the next step of _common.lua.
local call, queue, lease_idx, close_idx = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local unrecorded, epoch_key, clock_key = KEYS[5], KEYS[6], KEYS[7]
local key, attempt, mode, jitter, detail = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local owner, fence = ARGV[6], ARGV[7]

if is_stale(call, epoch_key) then
  drop_from_indexes(key, queue, lease_idx, close_idx)
  return {'kind', 'noop'}
end
local f = redis.call('HMGET', call, 'status', 'n', 'state', 'lease', 'owner', 'fence')
if attempt == '' then attempt = f[2] end
if f[1] ~= 'active' or f[2] ~= attempt then
  return {'kind', 'noop'}
end
local now = ledger_now(clock_key)
if f[3] == 'running' then
  if mode == 'lapsed' and tonumber(f[4]) > now then
    return {'kind', 'noop'}
  end
  if mode == 'worker_lost' and (owner == '' or f[5] ~= owner) then
    return {'kind', 'noop'}
  end
  if mode == 'released' and (fence == '' or f[6] ~= fence) then
    return {'kind', 'noop'}
  end
  log_attempt(call, attempt, 'lost', now, detail)
  redis.call('HSET', call, 'state', 'lost', 'fence', '')
  return next_step(call, queue, lease_idx, close_idx, unrecorded, key, now, 'lost', detail,
    jitter)
end
if f[3] == 'enqueued' and mode == 'worker_lost' then
  log_attempt(call, attempt, 'expired', now, detail)
  redis.call('HSET', call, 'state', 'expired')
  redis.call('ZREM', queue, key)
  return next_step(call, queue, lease_idx, close_idx, unrecorded, key, now, 'not_reached',
    detail, jitter)
end
return {'kind', 'noop'}
