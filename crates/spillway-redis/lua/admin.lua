-- spillway: the admin maps shared by every instance on one Redis
-- (overrides and plans assigned through the admin API), with a version
-- bumped by every change so instances can tell when to read them again.
--
-- KEYS[1]  the map's hash, <prefix>{admin}:map:<map>
-- KEYS[2]  the version, <prefix>{admin}:version (a counter; absent = 0)
-- ARGV[1]  'put', 'delete' or 'all'
-- ARGV[2]  the field (put, delete)
-- ARGV[3]  its value (put)
--
-- Both keys carry the hash tag {admin}, so one call serves a cluster.
-- A change and its version are one atomic step, and a listing is read
-- with the version it belongs to.
--
-- Returns, for put, the new version; for delete, {1 if the field was
-- there else 0, the new version}; for all, {the map as field, value,
-- field, value..., the version}.
local op = ARGV[1]
if op == 'put' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  return redis.call('INCR', KEYS[2])
elseif op == 'delete' then
  local gone = redis.call('HDEL', KEYS[1], ARGV[2])
  return { gone, redis.call('INCR', KEYS[2]) }
elseif op == 'all' then
  local version = redis.call('GET', KEYS[2]) or '0'
  return { redis.call('HGETALL', KEYS[1]), version }
end
return redis.error_reply('ERR spillway admin: unknown operation ' .. tostring(op))
