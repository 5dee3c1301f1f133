-- budget_read.lua: one budget scope's totals now (`budgets show`, metrics): reserved, spent
-- within the window, held. Replies kind = totals | missing (of another life or gone: nothing
-- is reserved in this life yet; the caller counts from SQL).
local bk, epoch_key, clock_key = KEYS[1], KEYS[2], KEYS[3]
local window = tonumber(ARGV[1])
local epoch, frozen = ledger_globals(epoch_key, clock_key)
local now = ledger_now(frozen)
local t = budget_load(bk, epoch, now, window)
if not t then
  return {'kind', 'missing'}
end
return {'kind', 'totals', 'reserved', tostring(t.r), 'spent', tostring(t.s), 'held', tostring(t.h)}
