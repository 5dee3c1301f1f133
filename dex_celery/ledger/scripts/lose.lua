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
--   unconfirmed the worker holding `fence` gives the attempt up before running any tool code,
--               because it could not commit its claim in the system of record (the database
--               refused the connection, or the connection broke during the commit). The call
--               ends `outcome_unknown` with reason `claim_unconfirmed`, which the dispatcher
--               judges from SQL once the database answers: no claim there, "did not run".
-- Replies kind = noop or the next step of _common.lua.
local call, queue, lease_idx, close_idx = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local unrecorded, epoch_key, clock_key = KEYS[5], KEYS[6], KEYS[7]
local key, attempt, mode, jitter, detail = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local owner, fence, flags = ARGV[6], ARGV[7], ARGV[8]

local c, frozen
c, attempt, frozen = live_call(call, key, attempt, epoch_key, clock_key, queue, lease_idx, close_idx)
if c == nil then return {'kind', 'noop'} end
if c.status ~= 'active' or c.n ~= attempt then
  return {'kind', 'noop'}
end
local now = ledger_now(frozen)
local w = {}
local step = {'kind', 'noop'}
if c.state == 'running' then
  if mode == 'lapsed' and tonumber(c.lease) > now then
    return step
  end
  if mode == 'worker_lost' and (owner == '' or c.owner ~= owner) then
    return step
  end
  if (mode == 'released' or mode == 'unconfirmed') and (fence == '' or c.fence ~= fence) then
    return step
  end
  local cause = 'lost'
  if mode == 'unconfirmed' then cause = 'unconfirmed' end
  log_attempt(w, c, attempt, cause, now, detail)
  put(w, c, 'state', cause, 'fence', '')
  step = next_step(w, c, queue, lease_idx, close_idx, unrecorded, key, now, cause, detail,
    jitter, flags)
elseif c.state == 'enqueued' and mode == 'worker_lost' then
  log_attempt(w, c, attempt, 'expired', now, detail)
  put(w, c, 'state', 'expired')
  redis.call('ZREM', queue, key)
  step = next_step(w, c, queue, lease_idx, close_idx, unrecorded, key, now, 'not_reached',
    detail, jitter, flags)
end
write_call(call, w)
return step
