-- budget_settle.lua: reconciliation settled a call whose outcome was unknown (S13.1): it went
-- through (its held charges are spent) or it did not run (they are released, usable again).
-- KEYS: the shard's epoch and clock, then the call's budget scopes. Replies kind = settled.
local epoch_key, clock_key = KEYS[1], KEYS[2]
local key, verdict = ARGV[1], ARGV[2]
local epoch, frozen = ledger_globals(epoch_key, clock_key)
local now = ledger_now(frozen)
local to = verdict == 'went_through' and 's' or ''
local moved = 0
for i = 3, #KEYS do
  if budget_move(KEYS[i], epoch, key, to, now) then
    moved = moved + 1
  end
end
return {'kind', 'settled', 'moved', tostring(moved)}
