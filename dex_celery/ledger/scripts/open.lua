-- open.lua: create a call's ledger entry with attempt 1 enqueued and, where the broker is this
-- same Redis, publish the attempt's message in the same atomic step (docs/ledger.md, "Opening a
-- call").
-- Replies kind = opened | exists | epoch (the ledger is not the one the caller knows: Redis went
-- back in time or was replaced; the caller refreshes its epoch and tries again).
local call, queue, epoch_key, clock_key, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local key, expected_epoch, effect, max_attempts = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local backoff_initial, backoff_max, s2s, s2c = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local heartbeat_timeout, events_maxlen, announce = ARGV[9], ARGV[10], ARGV[11]
-- '1' if an earlier ledger, since lost, may have handed the call to a worker (the sweeper
-- reopening a call after a rollback): its attempts then count as having reached one, so running
-- out of them is never reported as "did not run" (S4.2, S4.3).
local may_have_run = ARGV[12]
-- The effect flags (docs/ledger.md, "Effect flags"), from the class's row of the effect table
-- (dex_celery/model/effects.py): '1'/'0' whether a failed attempt may be retried, and the status
-- and reason a lost attempt ends with. Scripts read these, never the class name.
local retry, lost, lost_reason = ARGV[13], ARGV[14], ARGV[15]
-- The broker's commands of attempt 1's message (`ARGV[16]` of them, Kombu's own: the queue's
-- LPUSH, and a PEXPIRE or an event's PUBLISH where Kombu adds one): command i is `ARGV[15 + 2i]`
-- with target `KEYS[5 + i]` and value `ARGV[16 + 2i]`. Run only when the entry is opened, so a
-- message exists exactly when its entry does, and never one for a call that was open already.
local sends = tonumber(ARGV[16] or '0')
-- After the broker's commands, optionally: when a person approved the call (the ledger's
-- clock), so that a write freeze begun before that approval does not hold it again (claim.lua).
local passed = ARGV[17 + 2 * sends]
for i = 1, sends do  -- checked before anything is written: a refused open writes nothing
  local command = ARGV[15 + 2 * i]
  if command ~= 'lpush' and command ~= 'publish' and command ~= 'pexpire' then
    return redis.error_reply('open: no broker command ' .. tostring(command))
  end
end

local epoch, frozen = ledger_globals(epoch_key, clock_key)
if epoch ~= expected_epoch then
  return {'kind', 'epoch'}
end
if redis.call('EXISTS', call) == 1 then
  if not is_stale(redis.call('HGET', call, 'epoch'), epoch) then
    return {'kind', 'exists'}
  end
  -- Left by an earlier life of the ledger: what it says may be out of date; start afresh.
  redis.call('DEL', call)
end
local now = ledger_now(frozen)
local deadline = now + tonumber(s2s)
redis.call('HSET', call, 'status', 'active', 'n', 1, 'state', 'enqueued',
  'deadline', deadline, 'effect', effect, 'max', max_attempts, 'b0', backoff_initial,
  'bmax', backoff_max, 's2s', s2s, 's2c', s2c, 'hb', heartbeat_timeout,
  'reached', may_have_run == '1' and 1 or 0, 'opened_at', now, 'epoch', expected_epoch,
  'retry', retry, 'lost', lost, 'lost_reason', lost_reason)
if passed and passed ~= '' then
  redis.call('HSET', call, 'passed', passed)
end
redis.call('ZADD', queue, deadline, key)
if announce == '1' then
  redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*',
    'type', 'tool_call_requested', 'key', key, 'effect', effect)
end
for i = 1, sends do
  redis.call(ARGV[15 + 2 * i], KEYS[5 + i], ARGV[16 + 2 * i])
end
return {'kind', 'opened'}
