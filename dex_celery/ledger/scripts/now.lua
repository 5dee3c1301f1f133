-- now.lua: the ledger's clock (Redis TIME, or the frozen time the unit tests set), for the
-- times the Python side writes to SQL (requests, deadlines, outcomes).
return {'kind', 'now', 'now', tostring(ledger_now(redis.call('GET', KEYS[1])))}
