-- spillway: the admin maps shared by every instance on one Redis
-- (overrides and plans assigned through the admin API), with a version
-- bumped by every change so instances can tell when to read them again.
--
-- KEYS[1]  the map's hash, <prefix>{admin}:map:<map>
-- KEYS[2]  the version, <prefix>{admin}:version (a counter; absent = 0)
-- ARGV[1]  'put', 'delete', 'all', 'expire', 'incr' or 'get'
-- ARGV[2]  the field (put, delete, expire)
-- ARGV[3]  its value (put); the time now in ms (expire)
--
-- Both keys carry the hash tag {admin}, so one call serves a cluster.
-- A change and its version are one atomic step, and a listing is read
-- with the version it belongs to.
--
-- Returns, for put, the new version; for delete, {1 if the field was
-- there else 0, the new version}; for all, {the map as field, value,
-- field, value..., the version}; for expire (delete the field only if
-- its value, a JSON object, has an expires_unix_ms at or before now: an
-- instance sweeping what it saw end never deletes a newer one), like
-- delete; for incr and get, KEYS[1] is a plain counter (not a map, the
-- version untouched): its new or current value.
local op = ARGV[1]
if op == 'put' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  return redis.call('INCR', KEYS[2])
elseif op == 'delete' then
  local gone = redis.call('HDEL', KEYS[1], ARGV[2])
  return { gone, redis.call('INCR', KEYS[2]) }
elseif op == 'expire' then
  local v = redis.call('HGET', KEYS[1], ARGV[2])
  if not v then
    return { 0, tonumber(redis.call('GET', KEYS[2]) or '0') }
  end
  local ok, o = pcall(cjson.decode, v)
  local ends = ok and type(o) == 'table' and tonumber(o['expires_unix_ms'])
  if ends and ends <= tonumber(ARGV[3]) then
    redis.call('HDEL', KEYS[1], ARGV[2])
    return { 1, redis.call('INCR', KEYS[2]) }
  end
  return { 0, tonumber(redis.call('GET', KEYS[2]) or '0') }
elseif op == 'incr' then
  return redis.call('INCR', KEYS[1])
elseif op == 'get' then
  return tonumber(redis.call('GET', KEYS[1]) or '0')
elseif op == 'all' then
  local version = redis.call('GET', KEYS[2]) or '0'
  return { redis.call('HGETALL', KEYS[1]), version }
end
return redis.error_reply('ERR spillway admin: unknown operation ' .. tostring(op))
