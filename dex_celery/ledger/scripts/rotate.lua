-- rotate.lua: start a new life of the ledger after Redis went back in time (docs/ledger.md,
-- "Rollback"). Compare-and-set on the dataset marker, so two processes that notice the same
-- rollback rotate once. Every call hash of the old life becomes stale.
-- expected = '' means "no marker" (an empty Redis, or the first start). `seen_epoch` (optional,
-- '' for none) is the epoch the caller saw beside that marker: when only the epoch went (the
-- marker unchanged), two processes that saw it gone would both pass the marker's compare, so the
-- epoch is compared too.
-- Replies kind = rotated | raced, epoch = the epoch in force afterwards.
local epoch_key, dataset_key = KEYS[1], KEYS[2]
local expected, new_dataset, new_epoch, seen_epoch = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local current = redis.call('GET', dataset_key) or ''
if current ~= expected or (seen_epoch and (redis.call('GET', epoch_key) or '') ~= seen_epoch) then
  return {'kind', 'raced', 'epoch', redis.call('GET', epoch_key) or ''}
end
redis.call('SET', epoch_key, new_epoch)
redis.call('SET', dataset_key, new_dataset)
return {'kind', 'rotated', 'epoch', new_epoch}
