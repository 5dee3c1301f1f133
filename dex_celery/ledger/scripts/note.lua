-- note.lua: a worker handed an attempt it cannot run (it does not have the tool: an older
-- release during a rolling deploy) says so on the attempt while it waits in the queue. Written
-- only while attempt n is the current, enqueued attempt of a live call of this ledger life; it
-- is shown with that attempt (`calls show`) and joins the did-not-run text if the attempt's
-- schedule-to-start deadline passes (expire.lua).
-- Replies kind = noted (the attempt still waits for a worker: hand its message back) or noop
-- (claimed, ended, or of an older ledger life: its message is stale and may be dropped).
local call, epoch_key, clock_key = KEYS[1], KEYS[2], KEYS[3]
local attempt, note = ARGV[1], ARGV[2]

local f = redis.call('HMGET', call, 'status', 'n', 'state', 'epoch')
if f[1] ~= 'active' or f[2] ~= attempt or f[3] ~= 'enqueued' then
  return {'kind', 'noop'}
end
local epoch = ledger_globals(epoch_key, clock_key)
if is_stale(f[4], epoch) then
  return {'kind', 'noop'}
end
redis.call('HSET', call, 'waiting_n', attempt, 'waiting', note)
return {'kind', 'noted'}
