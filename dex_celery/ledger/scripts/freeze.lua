-- freeze.lua: replace one shard's copy of the write freezes in force (docs/semantics.md, S13.2)
-- with what the database holds: ARGV[1] is one JSON object (a tool's name or '*' -> the freeze,
-- `model/freeze.py`), '' for none (the key is deleted). `claim.lua` reads this key in the same
-- MGET as the epoch, in the slot of the call it claims. Replies kind = set.
local freeze_key, freezes = KEYS[1], ARGV[1]
if freezes == '' then
  redis.call('DEL', freeze_key)
else
  redis.call('SET', freeze_key, freezes)
end
return {'kind', 'set'}
