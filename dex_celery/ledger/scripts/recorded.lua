-- recorded.lua: the outcome has landed in SQL; let the ledger entry expire and announce it.
-- Only the writer that removes the key from the unrecorded index announces it, so every call
-- gets exactly one tool_call_finished event (S7.3) however many writers race.
-- Replies kind = announced | noop.
local call, unrecorded, events = KEYS[1], KEYS[2], KEYS[3]
local key, ttl, events_maxlen, status, error_text = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if redis.call('ZREM', unrecorded, key) == 0 then
  return {'kind', 'noop'}
end
redis.call('EXPIRE', call, ttl)
redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*',
  'type', 'tool_call_finished', 'key', key, 'status', status, 'error', error_text)
return {'kind', 'announced'}
