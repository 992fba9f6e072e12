-- The mixed load in Redis: by the random user id, 95% signal (as signal.lua),
-- 4% status (SISMEMBER), 1% leave or rejoin (SADD / SREM).
-- ARGV: user, entity, community, country
local roll = tonumber(ARGV[1]) % 100
if roll < 95 then
  redis.call('HINCRBY', 'ledger:' .. ARGV[2], 'view', 1)
  if redis.call('SISMEMBER', 'left', ARGV[1]) == 1 then
    return 0
  end
  redis.call('HINCRBY', 'community:' .. ARGV[3] .. ':' .. ARGV[2], 'view', 1)
  if ARGV[4] == 'DE' then
    redis.call('HINCRBY', 'cohort:bench-de:' .. ARGV[2], 'view', 1)
  end
  return 1
elseif roll < 99 then
  return redis.call('SISMEMBER', 'left', ARGV[1])
elseif roll == 99 and tonumber(ARGV[1]) % 2 == 0 then
  return redis.call('SADD', 'left', ARGV[1])
else
  return redis.call('SREM', 'left', ARGV[1])
end
