-- spillway: one atomic decision over every limit of every rule.
--
-- The same algorithms as crates/spillway-core, in microseconds (Lua numbers
-- are doubles: integers are exact up to 2^53, i.e. 285 years of microseconds).
--
-- KEYS[i]  where the i-th limit lives (rules in order, their limits in order):
--          for the sliding log its own list; for every other algorithm the
--          hash ("bucket") that holds its state in one field, next to the
--          states of other clients whose tags fall in the same bucket
-- ARGV[1]  now in microseconds, or 0 to use this server's TIME (the default:
--          instances with skewed clocks then agree)
-- ARGV[2]  cost
-- ARGV[3]  1 for a dry run (decide, write nothing), else 0
-- ARGV[4]  number of rules
-- then per rule: mode (0 hard, 1 soft, 2 shadow), number of limits,
-- and per limit five numbers: algorithm, base size, enforced size, a, b,
-- then the limit's field in its bucket (ignored for the sliding log)
--   1 token bucket      a = microseconds per token
--   2 leaky bucket      a = microseconds per unit leaked
--   3 shaper            a = microseconds per unit, b = max wait
--   4 fixed window      a = window
--   5 sliding log       a = window
--   6 sliding counter   a = window
--   7 gcra              a = microseconds per request
--
-- Returns {now, then per limit 12 numbers: the verdict under the enforced
-- size, then under the base size: allowed (1/0), limit, remaining, reset,
-- retry after (-1 = never), wait}.
--
-- Every key written gets a TTL in the same call, so idle keys vanish.
-- Counter states share small hashes: a Redis key costs about 110 bytes
-- before it holds anything, a field in a small hash about 20. A state's
-- first number is the time it expires (after which it is as good as
-- absent); a bucket's TTL is never shorter than its longest-lived field's,
-- and a write that adds a field sweeps a sample of the bucket for expired
-- ones one time in four, so dead fields stay a small fraction.

local NEVER = -1

local function int(x)
  return string.format('%.0f', x)
end

local function vsched(tat, now, inc, horizon)
  local start = math.max(tat, now)
  local e = start + inc
  if e - now <= horizon then
    return true, start, e, now
  end
  if inc > horizon then
    return false, start, tat, NEVER
  end
  return false, start, tat, tat + inc - horizon
end

local function vverdict(ok, nxt, retry_at, now, size, interval, horizon)
  local backlog = math.max(nxt, now) - now
  local rem = math.min(math.floor((horizon - math.min(backlog, horizon)) / interval), size)
  local retry = 0
  if not ok then
    if retry_at == NEVER then retry = NEVER else retry = math.max(retry_at - now, 0) end
  end
  return { ok and 1 or 0, size, rem, backlog, retry, 0 }
end

-- Each returns: verdict, next state (string), expiry (absolute microseconds).
local algo = {}

local function bucket(state, size, a, b, now, cost)
  local tat = tonumber(state) or 0
  local horizon = size * a
  local ok, start, nxt, retry_at = vsched(tat, now, cost * a, horizon)
  return vverdict(ok, nxt, retry_at, now, size, a, horizon), int(nxt), nxt
end
algo[1] = bucket
algo[7] = bucket

algo[3] = function(state, size, a, b, now, cost)
  local tat = tonumber(state) or 0
  local horizon = size * a
  local ok, start, nxt, retry_at = vsched(tat, now, cost * a, horizon)
  local wait = start - now
  if ok and wait > b then
    ok, nxt, retry_at = false, tat, math.max(tat - b, 0)
  elseif (not ok) and retry_at ~= NEVER then
    retry_at = math.max(retry_at, tat - b)
  end
  local v = vverdict(ok, nxt, retry_at, now, size, a, horizon)
  if ok then v[6] = wait end
  return v, int(nxt), nxt
end

local function pair(state)
  if not state then return 0, 0, 0 end
  local x, y, z = string.match(state, '^(%d+),(%d+),?(%d*)$')
  return tonumber(x) or 0, tonumber(y) or 0, tonumber(z) or 0
end

algo[2] = function(state, size, a, b, now, cost)
  local drains, measured = pair(state)
  local level_then = math.max(drains - measured, 0)
  local at = math.max(now, measured)
  local level = math.max(level_then - (at - measured), 0)
  local full, added = size * a, cost * a
  local new = level + added
  if new <= full then
    local nd = at + new
    local rem = math.min(math.floor((full - new) / a), size)
    return { 1, size, rem, nd - math.min(now, nd), 0, 0 }, int(nd) .. ',' .. int(at), nd
  end
  local retry = NEVER
  if added <= full then retry = (at - now) + (new - full) end
  local rem = math.min(math.floor((full - math.min(level, full)) / a), size)
  return { 0, size, rem, (at - now) + level, retry, 0 }, state, drains
end

algo[4] = function(state, size, w, b, now, cost)
  local e, count = pair(state)
  if now >= e then
    e, count = now - math.fmod(now, w) + w, 0
  end
  local reset = e - now
  local total = count + cost
  if total <= size then
    return { 1, size, size - total, reset, 0, 0 }, int(e) .. ',' .. int(total), e
  end
  local retry = reset
  if cost > size then retry = NEVER end
  return { 0, size, math.max(size - count, 0), reset, retry, 0 }, state, e
end

algo[6] = function(state, size, w, b, now, cost)
  local expires, cur0, prev0 = pair(state)
  local stored_end = math.max(expires - w, 0)
  local e, cur, prev
  if expires == 0 or now >= expires then
    e, cur, prev = now - math.fmod(now, w) + w, 0, 0
  elseif now >= stored_end then
    e, cur, prev = stored_end + w, 0, cur0
  else
    e, cur, prev = stored_end, cur0, prev0
  end
  local start = e - w
  local elapsed = math.max(now, start) - start
  -- prev*(W-elapsed) + (cur+cost)*W <= size*W: exact while the products
  -- stay below 2^53, else divided by W in floating point.
  local wp = prev * (w - math.min(elapsed, w))
  local weighted = wp / w
  local estimate = math.ceil(weighted) + cur
  local reset = e + w - math.min(now, e)
  local lhs, rhs = wp + (cur + cost) * w, size * w
  local fits
  if lhs < 9007199254740992 and rhs < 9007199254740992 then
    fits = lhs <= rhs
  else
    fits = weighted + cur + cost <= size
  end
  if fits then
    local nc = math.min(cur + cost, 4294967295)
    return { 1, size, math.max(size - (estimate + cost), 0), reset, 0, 0 },
      int(e + w) .. ',' .. int(nc) .. ',' .. int(prev), e + w
  end
  local retry = NEVER
  if cost <= size then
    local function earliest(p, avail)
      if p == 0 then return 0 end
      return math.max(w - math.floor(avail * w / p), 0)
    end
    local at
    if cur + cost <= size then
      at = start + earliest(prev, size - cur - cost)
    else
      at = start + w + earliest(cur, size - cost)
    end
    retry = at - now
  end
  return { 0, size, math.max(size - estimate, 0), reset, retry, 0 }, state, expires
end

-- The sliding log is a list of admission times (microseconds), oldest first.
local function log_live(key, w, now)
  local all = redis.call('LRANGE', key, 0, -1)
  local dead = 0
  for i = 1, #all do
    if tonumber(all[i]) + w <= now then dead = i else break end
  end
  return all, dead
end

local function log_decide(key, size, w, now, cost)
  local all, dead = log_live(key, w, now)
  local count = #all - dead
  local newest_end = 0
  if #all > 0 then newest_end = tonumber(all[#all]) + w end
  local total = count + cost
  if total <= size then
    return { 1, size, size - total, math.max(now + w, newest_end) - now, 0, 0 }
  end
  local retry = NEVER
  if cost <= size then
    retry = math.max(tonumber(all[dead + total - size]) + w - now, 0)
  end
  return { 0, size, math.max(size - count, 0), math.max(newest_end - now, 0), retry, 0 }
end

local function log_commit(key, size, w, now, cost)
  local all, dead = log_live(key, w, now)
  if dead > 0 then redis.call('LTRIM', key, dead, -1) end
  local t = now
  if #all > dead then t = math.max(now, tonumber(all[#all])) end
  local n = math.min(cost, size)
  local items = {}
  for i = 1, n do items[i] = int(t) end
  -- RPUSH in chunks: Lua's unpack has a stack limit.
  local i = 1
  while i <= n do
    local j = math.min(i + 999, n)
    redis.call('RPUSH', key, unpack(items, i, j))
    i = j + 1
  end
  redis.call('PEXPIRE', key, math.max(math.ceil((t + w - now) / 1000), 1))
end

-- Removes expired fields among up to 16 of the bucket's, sparing `keep`.
local function sweep(key, keep, now)
  local sample = redis.call('HRANDFIELD', key, 16, 'WITHVALUES')
  local dead = {}
  for i = 1, #sample, 2 do
    local f = sample[i]
    if f ~= keep then
      local e = tonumber(string.match(sample[i + 1], '^%d+'))
      if e and e <= now then dead[#dead + 1] = f end
    end
  end
  if #dead > 0 then redis.call('HDEL', key, unpack(dead)) end
end

-- Writes a state with `ttl` ms to live: the bucket's TTL only grows (GT),
-- or is set if it has none yet (NX).
local function bucket_set(key, field, value, ttl, now)
  local added = redis.call('HSET', key, field, value)
  if redis.call('PEXPIRE', key, ttl, 'GT') == 0 then
    redis.call('PEXPIRE', key, ttl, 'NX')
  end
  if added == 1 and now % 4 == 0 then sweep(key, field, now) end
end

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local dry = ARGV[3] == '1'
local nrules = tonumber(ARGV[4])

local out = { now }
local n = 1
local rules = {}
local p, k = 5, 1
local allowed = true
for r = 1, nrules do
  local mode, nl = tonumber(ARGV[p]), tonumber(ARGV[p + 1])
  p = p + 2
  local hard_ok, enf_ok = true, true
  local limits = {}
  for l = 1, nl do
    local code = tonumber(ARGV[p])
    local base, enf = tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
    local a, b = tonumber(ARGV[p + 3]), tonumber(ARGV[p + 4])
    local field = ARGV[p + 5]
    p = p + 6
    local key = KEYS[k]
    k = k + 1
    local ve, vb, nxt, exp
    if code == 5 then
      ve = log_decide(key, enf, a, now, cost)
      vb = ve
      if base ~= enf then vb = log_decide(key, base, a, now, cost) end
    else
      local f = algo[code]
      local state = redis.call('HGET', key, field)
      ve, nxt, exp = f(state, enf, a, b, now, cost)
      vb = ve
      if base ~= enf then vb = f(state, base, a, b, now, cost) end
    end
    hard_ok = hard_ok and vb[1] == 1
    enf_ok = enf_ok and ve[1] == 1
    limits[l] = { code = code, key = key, field = field, size = enf, a = a, nxt = nxt, exp = exp }
    for i = 1, 6 do out[n + i] = ve[i] end
    for i = 1, 6 do out[n + 6 + i] = vb[i] end
    n = n + 12
  end
  local charge, admits
  if mode == 1 then
    charge, admits = enf_ok, enf_ok
  elseif mode == 2 then
    charge, admits = hard_ok, true
  else
    charge, admits = hard_ok, hard_ok
  end
  allowed = allowed and admits
  rules[r] = { charge = charge, limits = limits }
end

if allowed and not dry then
  for r = 1, nrules do
    if rules[r].charge then
      for _, l in ipairs(rules[r].limits) do
        if l.code == 5 then
          log_commit(l.key, l.size, l.a, now, cost)
        else
          bucket_set(l.key, l.field, l.nxt, math.max(math.ceil((l.exp - now) / 1000), 1), now)
        end
      end
    end
  end
end
return out
