-- _budget.lua: write budgets (docs/guardrails.md, "Budgets"; docs/semantics.md, S13.1),
-- prepended to the scripts that reserve, settle, seed or read them. Like `_common.lua` it only
-- defines functions and reads no KEYS or ARGV of its own.
--
-- One budget scope (a budget's name and its session, principal or deployment) is two keys in
-- the slot of the ledger's shard (`ledger/keys.py`): the hash `bk` and the sorted set
-- `bk .. '#spent'` (call key -> when it was spent, for a rolling window). The hash holds
--   epoch        the ledger life it was built in; another life's (or none) is rebuilt from SQL
--   r, s, h      the amounts reserved, spent (within the window) and held
--   c:<key>      one call's charge: '<state> <amount>', state r | s | h | p; released = gone
-- A call's charges move only forward: r -> s | h | released, h -> s | released. State p is a
-- charge a rebuild counted for a call SQL shows pending and unclaimed, which this life has not
-- judged: counted as reserved (conservatively) until its call is opened and judged like any
-- other (`open.lua`), never admitted for having been counted.

-- Whether the ledger's marker `dataset_key` (`<run_id>:<evicted_keys>`, written by the
-- rollback guard) names the server running this script: false after a restart from an older
-- snapshot, a promoted replica, or an eviction. An emulator without INFO cannot go back in time.
local function budget_server_is(dataset_key)
  local ok, server = pcall(redis.call, 'INFO', 'server')
  if not ok then
    return true
  end
  local stats = redis.call('INFO', 'stats')
  local marker = string.match(server, 'run_id:(%w+)') .. ':' ..
    (string.match(stats, 'evicted_keys:(%d+)') or '0')
  return redis.call('GET', dataset_key) == marker
end

-- The totals of one scope after dropping what was spent before the window; nil when the hash
-- is of another ledger life or gone (the caller rebuilds it from SQL). `window` 0: the session's
-- lifetime, nothing expires.
local function budget_load(bk, epoch, now, window)
  local g = redis.call('HMGET', bk, 'epoch', 'r', 's', 'h')
  if g[1] ~= epoch then
    return nil
  end
  local t = {r = tonumber(g[2]) or 0, s = tonumber(g[3]) or 0, h = tonumber(g[4]) or 0}
  if window > 0 then
    local sk = bk .. '#spent'
    local old = redis.call('ZRANGEBYSCORE', sk, '-inf', now - window)
    if #old > 0 then
      for _, key in ipairs(old) do
        local e = redis.call('HGET', bk, 'c:' .. key)
        if e and string.sub(e, 1, 1) == 's' then
          t.s = t.s - tonumber(string.sub(e, 3))
          redis.call('HDEL', bk, 'c:' .. key)
        end
      end
      redis.call('ZREMRANGEBYSCORE', sk, '-inf', now - window)
      redis.call('HSET', bk, 's', t.s)
    end
  end
  return t
end

-- An idle scope (nothing reserved or held) may go: what it counted is in SQL and a rebuild
-- counts it again. One with a charge in flight stays as long as it has one.
local function budget_keep(bk, t, window)
  if t.r <= 0 and t.h <= 0 then
    local ttl = window > 0 and math.ceil(window) + 60 or 86400
    redis.call('EXPIRE', bk, ttl)
    redis.call('EXPIRE', bk .. '#spent', ttl)
  else
    redis.call('PERSIST', bk)
    redis.call('PERSIST', bk .. '#spent')
  end
end

-- Move call `key`'s charge in scope `bk` to `to` ('s' spent, 'h' held, '' released). A spent
-- charge stays spent; a scope of another life is left alone (its rebuild reads SQL, which
-- holds the call's end already). Returns the state it moved from, or nil.
local function budget_move(bk, epoch, key, to, now)
  local g = redis.call('HMGET', bk, 'epoch', 'c:' .. key, 'r', 's', 'h', 'window')
  local e = g[2]
  if g[1] ~= epoch or not e then
    return nil
  end
  local from, amount = string.sub(e, 1, 1), tonumber(string.sub(e, 3))
  if from == to or from == 's' then
    return nil
  end
  local t = {r = tonumber(g[3]) or 0, s = tonumber(g[4]) or 0, h = tonumber(g[5]) or 0}
  local total = from == 'p' and 'r' or from
  t[total] = t[total] - amount
  local w = {total, t[total]}
  if to == '' then
    redis.call('HDEL', bk, 'c:' .. key)
  else
    t[to] = t[to] + amount
    w[#w + 1], w[#w + 2] = to, t[to]
    w[#w + 1], w[#w + 2] = 'c:' .. key, to .. ' ' .. amount
    if to == 's' then
      redis.call('ZADD', bk .. '#spent', now, key)
    end
  end
  redis.call('HSET', bk, unpack(w))
  budget_keep(bk, t, tonumber(g[6]) or 0)
  return from
end

-- Settle every charge of a call whose outcome is `status` (as the database holds it).
-- `budgets` is the call hash's field: its scopes' keys, space-separated.
local function budget_settle(budgets, epoch, key, status, now)
  if not budgets or budgets == '' then
    return
  end
  local to = ''
  if status == 'succeeded' then
    to = 's'
  elseif status == 'outcome_unknown' then
    to = 'h'
  end
  for bk in string.gmatch(budgets, '%S+') do
    budget_move(bk, epoch, key, to, now)
  end
end
