-- budget_seed.lua: rebuild one budget scope from SQL (S13.1) in this ledger life: after Redis
-- went back in time or lost it, or after the idle scope expired. Written only while the scope
-- is still of another life or gone (compare-and-set: two requesters rebuild it once); what the
-- database shows is counted conservatively: every call not ended is reserved (p: not judged in
-- this life yet, see `_budget.lua`), every unknown outcome not reconciled is held, every success
-- in the window is spent.
-- KEYS: the scope's hash, the shard's epoch. ARGV: the epoch the caller counted in, the window,
-- then (key, state, amount, spent_at) per call. Replies kind = seeded | current | epoch.
local bk, epoch_key = KEYS[1], KEYS[2]
local expected, window = ARGV[1], tonumber(ARGV[2])
local epoch = redis.call('GET', epoch_key)
if epoch ~= expected then
  return {'kind', 'epoch'}
end
if redis.call('HGET', bk, 'epoch') == epoch then
  return {'kind', 'current'}
end
local sk = bk .. '#spent'
redis.call('DEL', bk, sk)
local t = {r = 0, s = 0, h = 0}
local w = {'epoch', epoch, 'window', window}
for i = 3, #ARGV, 4 do
  local key, state, amount, at = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local total = state == 'p' and 'r' or state
  t[total] = t[total] + amount
  w[#w + 1], w[#w + 2] = 'c:' .. key, state .. ' ' .. amount
  if state == 's' then
    redis.call('ZADD', sk, tonumber(at), key)
  end
end
w[#w + 1], w[#w + 2] = 'r', t.r
w[#w + 1], w[#w + 2] = 's', t.s
w[#w + 1], w[#w + 2] = 'h', t.h
redis.call('HSET', bk, unpack(w))
budget_keep(bk, t, window)
return {'kind', 'seeded'}
