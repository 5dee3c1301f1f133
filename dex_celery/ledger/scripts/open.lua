-- open.lua: create a call's ledger entry with attempt 1 enqueued and, where the broker is this
-- same Redis, publish the attempt's message in the same atomic step (docs/ledger.md, "Opening a
-- call").
-- Replies kind = opened | exists | over (a budget has too little left: `budget` j and its
-- totals) | rebuild (budget j's scope must first be counted from SQL: `budget_seed.lua`) |
-- epoch (the ledger is not the one the caller knows: Redis went back in time or was replaced;
-- the caller refreshes its epoch and tries again).
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
-- The call's write budgets (S13.1; `_budget.lua`), JSON: one `[limit, amount, window, force]`
-- per budget scope, whose hash is `KEYS[5 + sends + j]`, then the shard's `dataset` marker as
-- the last key; '' for none. `force` 1: a person
-- approved this call, so it is reserved even over the limit.
local budgets = ARGV[16]
-- The broker's commands of attempt 1's message (`ARGV[17]` of them, Kombu's own: the queue's
-- LPUSH, and a PEXPIRE or an event's PUBLISH where Kombu adds one): command i is `ARGV[16 + 2i]`
-- with target `KEYS[5 + i]` and value `ARGV[17 + 2i]`. Run only when the entry is opened, so a
-- message exists exactly when its entry does, and never one for a call that was open already.
local sends = tonumber(ARGV[17] or '0')
-- After the broker's commands, optionally: when a person approved the call (the ledger's
-- clock), so that a write freeze begun before that approval does not hold it again (claim.lua).
local passed = ARGV[18 + 2 * sends]
for i = 1, sends do  -- checked before anything is written: a refused open writes nothing
  local command = ARGV[16 + 2 * i]
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
-- A budget is judged only on data of this server's own life: Redis restarted from an older
-- snapshot, or a lagging replica promoted, holds a scope with fewer charges than were admitted,
-- under the same epoch until the next sweep looks. The shard's marker (`ledger/guard.py`) must
-- name this very server (its run id and evictions), read in this same step; otherwise the
-- caller refreshes its epoch, which starts a new life, and the scope is counted from SQL.
if budgets and budgets ~= '' and not budget_server_is(KEYS[#KEYS]) then
  return {'kind', 'epoch'}
end
-- Every budget is judged before anything is written: a call over any of them opens nothing
-- (and publishes nothing); its requester moves it to wait for a person, or rejects it.
local charges, scopes = {}, {}
if budgets and budgets ~= '' then
  charges = cjson.decode(budgets)
  local over = nil
  for j, b in ipairs(charges) do
    local bk = KEYS[5 + sends + j]
    local t = budget_load(bk, epoch, now, b[3])
    if not t then
      return {'kind', 'rebuild', 'budget', tostring(j)}
    end
    local mine = redis.call('HGET', bk, 'c:' .. key)
    -- Judged already in this life (reserved, held or spent): counted, not judged again. A
    -- charge a rebuild counted (p) is judged without itself.
    local counted = 0
    if mine and string.sub(mine, 1, 1) == 'p' then
      counted = tonumber(string.sub(mine, 3))
    elseif mine then
      b[7] = true
    end
    if not b[7] and not over and b[4] ~= 1 and t.r - counted + t.s + t.h + b[2] > b[1] then
      over = {'kind', 'over', 'budget', tostring(j), 'reserved', tostring(t.r - counted),
        'spent', tostring(t.s), 'held', tostring(t.h)}
    end
    b[5], b[6] = t, counted
    scopes[#scopes + 1] = bk
  end
  if over then
    -- Not admitted: a charge a rebuild counted for it is no longer in flight.
    for j, b in ipairs(charges) do
      if b[6] > 0 then
        local bk, t = KEYS[5 + sends + j], b[5]
        t.r = t.r - b[6]
        redis.call('HDEL', bk, 'c:' .. key)
        redis.call('HSET', bk, 'r', t.r)
        budget_keep(bk, t, b[3])
      end
    end
    return over
  end
end
for j, b in ipairs(charges) do
  if not b[7] then
    local bk, t = KEYS[5 + sends + j], b[5]
    t.r = t.r - b[6] + b[2]
    redis.call('HSET', bk, 'c:' .. key, 'r ' .. b[2], 'r', t.r, 'window', b[3])
    budget_keep(bk, t, b[3])
  end
end
local deadline = now + tonumber(s2s)
redis.call('HSET', call, 'status', 'active', 'n', 1, 'state', 'enqueued',
  'deadline', deadline, 'effect', effect, 'max', max_attempts, 'b0', backoff_initial,
  'bmax', backoff_max, 's2s', s2s, 's2c', s2c, 'hb', heartbeat_timeout,
  'reached', may_have_run == '1' and 1 or 0, 'opened_at', now, 'epoch', expected_epoch,
  'retry', retry, 'lost', lost, 'lost_reason', lost_reason)
if #scopes > 0 then
  redis.call('HSET', call, 'budgets', table.concat(scopes, ' '))
end
if passed and passed ~= '' then
  redis.call('HSET', call, 'passed', passed)
end
redis.call('ZADD', queue, deadline, key)
if announce == '1' then
  redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*',
    'type', 'tool_call_requested', 'key', key, 'effect', effect)
end
for i = 1, sends do
  redis.call(ARGV[16 + 2 * i], KEYS[5 + i], ARGV[17 + 2 * i])
end
return {'kind', 'opened'}
