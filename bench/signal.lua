-- The work tidal does per signal, in Redis: a ledger counter, the leave gate,
-- and, for an active user, a community counter and a cohort counter.
-- ARGV: user, entity, community, country
redis.call('HINCRBY', 'ledger:' .. ARGV[2], 'view', 1)
if redis.call('SISMEMBER', 'left', ARGV[1]) == 1 then
  return 0
end
redis.call('HINCRBY', 'community:' .. ARGV[3] .. ':' .. ARGV[2], 'view', 1)
if ARGV[4] == 'DE' then
  redis.call('HINCRBY', 'cohort:bench-de:' .. ARGV[2], 'view', 1)
end
return 1
