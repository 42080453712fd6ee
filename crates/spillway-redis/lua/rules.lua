-- spillway: the rules made over the admin API, shared by every instance
-- on one Redis, with one change log that instances pull from by version.
--
-- KEYS[1]  <prefix>{rules}:rules    hash: rule name -> the rule as JSON
-- KEYS[2]  <prefix>{rules}:version  counter, bumped by every change (absent = 0)
-- KEYS[3]  <prefix>{rules}:log      sorted set: rule name scored by the
--                                   version of its last change (a put or
--                                   a delete: a deleted name stays as a
--                                   tombstone, absent from the hash)
-- ARGV[1]  'put', 'delete', 'since' or 'version'
--
-- put     ARGV[2] name, ARGV[3] rule JSON, ARGV[4] precondition, ARGV[5]
--         the most rules held. Returns {status, version}: 'ok' and the new
--         version; 'exists' or 'mismatch' and the rule's own version (0
--         when absent); 'full' and 0.
-- delete  ARGV[2] name, ARGV[3] precondition. Returns {'ok', new version},
--         {'absent', 0} or {'mismatch', the rule's own version}.
-- since   ARGV[2] a version, ARGV[3] the most changes returned. Returns
--         {current version, name, its version, its JSON or false (deleted),
--         name, ...}, the changes after that version in version order.
-- version Returns the current version.
--
-- A precondition is '' (none), '*' (the rule must exist: If-Match: *),
-- '-' (it must not: If-None-Match: *) or a decimal version the rule must
-- have now (If-Match with its ETag).
--
-- Every key carries the hash tag {rules}, so one call serves a cluster. A
-- change, its entry in the log and the version's bump are one atomic step;
-- every change has a version of its own, so a reader resumes after the
-- last version it saw and misses nothing.
local op = ARGV[1]

local function own_version(name)
  return tonumber(redis.call('ZSCORE', KEYS[3], name) or '0')
end

local function holds(name, pre, exists)
  if pre == '' then
    return nil
  elseif pre == '*' then
    if not exists then return 'mismatch' end
  elseif pre == '-' then
    if exists then return 'exists' end
  else
    if not exists or own_version(name) ~= tonumber(pre) then
      return 'mismatch'
    end
  end
  return nil
end

if op == 'put' then
  local name = ARGV[2]
  local exists = redis.call('HEXISTS', KEYS[1], name) == 1
  local failed = holds(name, ARGV[4], exists)
  if failed then
    return { failed, exists and own_version(name) or 0 }
  end
  if not exists and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[5]) then
    return { 'full', 0 }
  end
  redis.call('HSET', KEYS[1], name, ARGV[3])
  local v = redis.call('INCR', KEYS[2])
  redis.call('ZADD', KEYS[3], v, name)
  return { 'ok', v }
elseif op == 'delete' then
  local name = ARGV[2]
  local exists = redis.call('HEXISTS', KEYS[1], name) == 1
  if not exists then
    return { 'absent', 0 }
  end
  local failed = holds(name, ARGV[3], exists)
  if failed then
    return { failed, own_version(name) }
  end
  redis.call('HDEL', KEYS[1], name)
  local v = redis.call('INCR', KEYS[2])
  redis.call('ZADD', KEYS[3], v, name)
  return { 'ok', v }
elseif op == 'since' then
  local now = tonumber(redis.call('GET', KEYS[2]) or '0')
  local out = { now }
  local changed = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[2], '+inf',
    'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
  for i = 1, #changed, 2 do
    local name = changed[i]
    out[#out + 1] = name
    out[#out + 1] = tonumber(changed[i + 1])
    out[#out + 1] = redis.call('HGET', KEYS[1], name)
  end
  return out
elseif op == 'version' then
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
return redis.error_reply('ERR spillway rules: unknown operation ' .. tostring(op))
