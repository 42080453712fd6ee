#!lua
-- (A writing script for Redis 7, as decide.lua: refused as a whole with
-- OOM or READONLY rather than half run.)
--
-- spillway: a local-first instance says it is alive.
--
-- KEYS[1]  the sorted set of live instances: each member an instance's
--          name, scored with the TIME (microseconds) of its last heartbeat
-- ARGV[1]  this instance's name
-- ARGV[2]  how long an instance counts as alive after its last heartbeat,
--          in microseconds, below 2^53, in decimal
--
-- Scores this instance with this server's TIME (instances with skewed
-- clocks agree), drops the members whose last heartbeat is older than the
-- given life, and makes the set live that long again (it vanishes with
-- its last instance: nothing grows unswept). Returns, packed with
-- MessagePack as decide.lua's reply, TIME and the members left.
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local life = tonumber(ARGV[2])
redis.call('ZADD', key, now, ARGV[1])
-- '(' excludes the bound: a member exactly `life` old is still alive.
-- (string.format: Lua's own number to string keeps only 14 digits.)
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. string.format('%d', now - life))
redis.call('PEXPIRE', key, math.max(math.ceil(life / 1000), 1))
return cmsgpack.pack({ now, redis.call('ZCARD', key) })
