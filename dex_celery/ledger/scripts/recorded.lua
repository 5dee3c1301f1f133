-- recorded.lua: the outcome has landed in SQL; let the ledger entry expire and announce it.
-- KEYS[1] call hash  KEYS[2] unrecorded index  KEYS[3] events stream
-- ARGV[1] key  ARGV[2] ttl seconds  ARGV[3] events maxlen  ARGV[4] status  ARGV[5] error
-- Only the writer that removes the key from the unrecorded index announces it, so every
-- call gets exactly one tool_call_finished event (S7.3) however many writers race.
-- Returns 1 if this call announced it, else 0.
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*',
  'type', 'tool_call_finished', 'key', ARGV[1], 'status', ARGV[4], 'error', ARGV[5])
return 1
