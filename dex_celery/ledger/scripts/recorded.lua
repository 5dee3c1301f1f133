-- recorded.lua: the outcome has landed in SQL; let the ledger entry expire and announce it.
-- Only the writer that removes the key from the unrecorded index announces it, so every call
-- gets exactly one tool_call_finished event (S7.3) however many writers race.
-- Replies kind = announced | noop.
-- The call's write budgets (S13.1) are settled here, by the status the database holds, in the
-- same step: spent when it succeeded, held while its outcome is unknown, released otherwise.
local call, unrecorded, events, epoch_key, clock_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local key, ttl, events_maxlen, status, error_text = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if redis.call('ZREM', unrecorded, key) == 0 then
  return {'kind', 'noop'}
end
local budgets = redis.call('HGET', call, 'budgets')
if budgets then
  local g = redis.call('MGET', epoch_key, clock_key)
  local now = tonumber(g[2])
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  end
  budget_settle(budgets, g[1], key, status, now)
end
redis.call('EXPIRE', call, ttl)
redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*',
  'type', 'tool_call_finished', 'key', key, 'status', status, 'error', error_text)
return {'kind', 'announced'}
