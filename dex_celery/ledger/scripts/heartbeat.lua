-- heartbeat.lua: renew the leases of every attempt one worker process runs, in one call.
-- KEYS: the lease index, the epoch, the clock, then one call hash per running attempt.
-- ARGV: for each call i, its key then its fence.
-- Replies kind = beat, fenced = the 1-based positions (comma-separated) of calls whose attempt is
-- no longer this one (timed out, lost, finished, or left in an earlier life of the ledger);
-- their tools see `cancelled` and stop renewing.
local lease_idx, epoch_key, clock_key = KEYS[1], KEYS[2], KEYS[3]
local epoch, frozen = ledger_globals(epoch_key, clock_key)
local now = ledger_now(frozen)
local fenced = {}
for i = 4, #KEYS do
  local call = KEYS[i]
  local key, fence = ARGV[2 * (i - 3) - 1], ARGV[2 * (i - 3)]
  local f = redis.call('HMGET', call, 'state', 'fence', 'hb', 'epoch')
  if f[1] == 'running' and f[2] == fence and not is_stale(f[4], epoch) then
    local lease = now + tonumber(f[3])
    redis.call('HSET', call, 'lease', lease)
    redis.call('ZADD', lease_idx, 'XX', lease, key)
  else
    table.insert(fenced, tostring(i - 3))
  end
end
return {'kind', 'beat', 'fenced', table.concat(fenced, ',')}
