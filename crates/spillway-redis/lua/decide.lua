#!lua
-- (The line above declares a Redis 7 script with no flags, so a writing
-- one: Redis refuses the whole call with OOM at maxmemory under
-- noeviction, and with READONLY on a replica, before it runs. Without it
-- only calls that write failed, and the denials that write nothing
-- succeeded in between, so a full server looked healthy half the time.
-- PEXPIRE's NX and GT below need Redis 7 anyway.)
--
-- spillway: one atomic decision over every limit of every rule.
--
-- The same algorithms as crates/spillway-core, in microseconds (Lua numbers
-- are doubles: integers are exact up to 2^53, i.e. 285 years of microseconds).
--
-- One call decides one or more requests ("decisions"), one after the
-- other, each atomic and all-or-none on its own; a client batches the
-- decisions of concurrent requests into one call, sharing the cost of the
-- call and of reading the clock.
--
-- KEYS[i]  where the i-th limit lives (decisions in order, their rules in
--          order, their limits in order): for the sliding log its own list
--          (of runs: see RUN);
--          for every other algorithm the hash ("bucket") that holds its state
--          in one field, next to the states of other clients whose tags fall
--          in the same bucket
-- ARGV[1]  one MessagePack array of every number and field below (Redis
--          makes an object of each argument and the script a string of
--          each; cmsgpack unpacks them all at once, numbers as numbers):
--          number of distinct rules in this call, then each rule (the
--          decisions of a call mostly share a few rules, so their
--          parameters are sent, and parsed, once): mode (0 hard, 1 soft,
--          2 shadow), number of limits, and per limit six numbers:
--          algorithm, base size, enforced size, a, b, d
-- then     number of decisions, and per decision:
--   now in microseconds, or 0 to use this server's TIME (the default:
--   instances with skewed clocks then agree; read once per call)
--   cost (for a request the client sends at most one more than the
--   largest size in the call's rules, and below 2^53: above every size
--   any cost is denied alike, and products of it with a period stay
--   exact; for a charge after the fact, the cost itself below 2^53)
--   1 for a dry run (decide, write nothing; also a check of cost 0), 2 to
--   charge after the fact (below), 3 to refund (below: the first number
--   is then the time the units were taken, and the present is TIME), 4 to
--   lease (below), else 0
--   number of rules
--   then per rule: its number in the list above, then per limit its field
--   in its bucket (empty for the sliding log)
--   1 token bucket      a = microseconds per token
--   2 leaky bucket      a = microseconds per unit leaked
--   3 shaper            a = microseconds per unit, b = max wait
--   4 fixed window      a = window
--   5 sliding log       a = window
--   6 sliding counter   a = window
--   7 gcra              a = microseconds per request
--          d bounds what a charge after the fact may leave owing (see
--          below): for 1, 2, 3 and 7 the debt in microseconds past the
--          enforced size's horizon (the limit's max_debt); for 6 its
--          max_debt in microseconds too (see `counter_cap`); else 0
-- ARGV[2], ARGV[3]  (optional: the sync header of an exchange, see below)
--          an instance's name and a sequence number below 2^53, in
--          decimal; with them the last of KEYS is the hash of the last
--          sequence number of each instance
--
-- Returns one flat list, packed with MessagePack (cmsgpack, built into
-- Redis's Lua): with the sync header first its two numbers (below); then
-- per decision (for a lease first the units it took), per limit, a
-- verdict of five numbers
-- (allowed 1/0, remaining, reset, retry after (-1 = never), wait; the caller
-- knows the limit), for a soft rule twice: under the enforced (raised) size,
-- then under the base size. (Redis turns each number into a reply element
-- and the client parses each: the reply is kept to what the client lacks.)
--
-- A charge after the fact (flag 2: a cost known once the request was
-- served) counts `cost` on every limit of every rule (shadow ones too),
-- whatever the state, as crates/spillway-core's `charge` does: past the
-- limit the key owes the excess (a TAT beyond the burst, a level above
-- the capacity, a count above the limit; a sliding log keeps its newest
-- limit + 1 entries), repaid at the algorithm's own rate. Every state
-- charged is written with its TTL as for an admitted request, so it lives
-- until it is fresh again (debt included). Its verdicts are checks of
-- cost 0 on the state after the charge (for a soft rule both, raised
-- then as written). The client sends the cost whole below 2^53. The debt
-- is bounded as in crates/spillway-core: a schedule or a leaky bucket
-- owes at most d microseconds past its horizon (the enforced size times
-- a), and a sliding counter counts at most what keeps a key out d from
-- the charge (`counter_cap`), so a huge charge keeps a key out at most
-- one max_debt longer than its limit would (a fixed window's count,
-- capped at 2^53 - 1, and a sliding log's entries clear with their
-- window anyway). DEBT (about 71 years)
-- still caps a time-based debt, so every number stays exact.
--
-- A refund (flag 3: units a lease took and did not use, given back) takes
-- `cost` units off every limit of every rule (shadow ones too) as the
-- charge that took them moved the state, never below empty; the units
-- were taken at `since` (the decision's first number, never TIME; the
-- present is TIME): a schedule (token bucket, shaper, GCRA) moves back,
-- to max(now, time - cost x a); a leaky bucket's level drops by cost x a,
-- not below 0; a fixed window's count drops by cost, not below 0, only if
-- `since` is in the state's current window (a later window never counted
-- those units); a sliding counter's current window, or the previous one,
-- whichever holds `since` (neither: nothing); a sliding log drops up to
-- `cost` of its oldest entries at or after `since` (see `log_refund`). A state changed is
-- written with its TTL as a charge's; one that is already empty or
-- unaffected is left alone. Its verdicts are checks of cost 0 after it,
-- as a charge's.
--
-- A lease (flag 4) takes up to `cost` units now, all-or-none over the
-- rules as a request: the most every hard and soft rule admits is the
-- smallest `remaining` of their limits' checks of cost 0 (enforced
-- sizes; 0 where a check is refused). For every algorithm that is the
-- largest cost the limit admits: a schedule admits c while c x a fits in
-- what is left of its horizon (a shaper also while its wait fits, and a
-- refused check then leases nothing), a window or a log while count + c
-- is at most its size, a sliding counter while its estimate + c is. The
-- lease decides a request of c = min(cost, that) as flag 0 would (shadow
-- rules neither limit nor refuse it, and are charged if they admit it);
-- should it still be refused (the sliding counter's estimate rounds), or
-- c be 0, nothing is written and the verdicts are a check's of cost 0.
-- Its reply is c, then its verdicts.
--
-- The sync header (ARGV[2] and ARGV[3], an exchange of a local-first
-- instance): the reply starts with two more numbers, 1 if the call was
-- applied (else 0), and TIME in microseconds (read at the start, the
-- "now" of every decision without one). With an instance name, the call
-- is applied only if its sequence number is above the last one stored
-- for that instance (none stored: any), which it then stores: a push
-- sent again (a retry after a lost reply) changes nothing. Not applied,
-- every decision runs as a check of cost 0 (a dry run at TIME; a lease
-- answers 0 units), so the reply has the same shape. With an empty name
-- the call is always applied and nothing is stored. The hash holds per
-- instance two big-endian doubles, the number and the TIME it was
-- stored; it lives a day past its last write, and a write to a hash of
-- more than 8 instances drops those among 16 sampled that wrote nothing
-- for a day (instances that come and go leave no trail).
--
-- A request of cost 0 is a check: the client sends it as a dry run, so it
-- writes nothing and changes no TTL.
--
-- Every key written gets a TTL in the same call, so idle keys vanish.
-- Counter states share small hashes: a Redis key costs about 110 bytes
-- before it holds anything, a field in a small hash about 20. A state is
-- one to three numbers, each 8 bytes (a big-endian double), then until
-- when its bucket is known to live; the first number is the time it
-- expires (after which it is as good as absent). A bucket's TTL is never
-- shorter than its longest-lived field's, and most writes need no PEXPIRE
-- (see `store`). A write that adds a field to a bucket of more than 8
-- states sweeps a sample of it for expired ones one time in four, so dead
-- fields stay a small fraction.
--
-- Redis runs this whole chunk on every call, so it is written to allocate
-- little: one function, not one per algorithm; verdicts written straight
-- into the reply; a few flat tables made at their usual size. (Measured
-- with INFO commandstats, the decision part repeated 1,000 times in one
-- call: 2.4 to 1.6 µs per decision for the table changes alone.)

-- Locals, not globals, in the code below: each global read is a lookup.
local ARGV, KEYS, redis = ARGV, KEYS, redis
local NEVER = -1
local max, min, floor, fmod = math.max, math.min, math.floor, math.fmod
local fmt, tonumber = string.format, tonumber
-- Counter states and stamps are big-endian doubles packed with `struct`
-- (built into Redis's Lua): parsing and formatting decimal text (tonumber,
-- string.format) cost about a sixth of the script's time per decision.
-- (Not memory: Redis keeps decimal integers in a small hash as 8-byte
-- integers anyway.) Lua numbers are doubles, so nothing is rounded.
local bpack, bunpack = struct.pack, struct.unpack

-- The number packed at the start of `v` (a stamp, or a state's expiry),
-- or nil if there is none (a missing or foreign value).
local function first(v)
  if v and #v >= 8 then return (bunpack('>d', v)) end
  return nil
end

-- A sliding window counter's state rolled forward to the window `now`
-- falls in: that window's end, its count, the previous window's count,
-- and until when the bucket is known to live (nil without a state).
local function slide(state, w, now)
  local expires, cur0, prev0, known = 0, 0, 0, nil
  if state and #state >= 32 then expires, cur0, prev0, known = bunpack('>dddd', state) end
  local stored_end = max(expires - w, 0)
  if expires == 0 or now >= expires then
    return now - fmod(now, w) + w, 0, 0, known
  elseif now >= stored_end then
    return stored_end + w, 0, cur0, known
  end
  return stored_end, cur0, prev0, known
end

-- Decides one counter algorithm for `size` and writes the verdict to
-- out[o + 1 .. o + 5]. Returns when the state to write (if admitted)
-- expires, until when the bucket is known to live (the stored state's
-- last number, nil without one), and the state's one to three numbers.
local function counter(out, o, code, state, size, a, b, now, cost)
  local ok, rem, reset, retry, wait, exp, known = true, 0, 0, 0, 0, 0, nil
  local v1, v2, v3
  if code == 1 or code == 3 or code == 7 then
    -- A virtual schedule: the state is the theoretical arrival time.
    local tat = 0
    if state and #state >= 16 then tat, known = bunpack('>dd', state) end
    -- (Comparisons rather than math.max/min here and below: each call of
    -- a C function costs more than the arithmetic; this is the hot path.)
    local horizon, inc = size * a, cost * a
    local start = tat
    if now > tat then start = now end
    local e = start + inc
    local retry_at = now
    if e - now > horizon then
      ok, e = false, tat
      if inc > horizon then retry_at = NEVER else retry_at = tat + inc - horizon end
    end
    if code == 3 then
      wait = start - now
      if ok and wait > b then
        ok, e, retry_at = false, tat, max(tat - b, 0)
      elseif (not ok) and retry_at ~= NEVER then
        retry_at = max(retry_at, tat - b)
      end
      if not ok then wait = 0 end
    end
    if e > now then reset = e - now end
    local left = horizon - reset
    if left < 0 then left = 0 end
    left = left / a
    rem = left - left % 1
    if rem > size then rem = size end
    if not ok then
      if retry_at == NEVER then retry = NEVER else retry = max(retry_at - now, 0) end
    end
    v1, exp = e, e
  elseif code == 2 then
    local drains, measured = 0, 0
    if state and #state >= 24 then drains, measured, known = bunpack('>ddd', state) end
    local at = max(now, measured)
    local level = max(max(drains - measured, 0) - (at - measured), 0)
    local full, new = size * a, level + cost * a
    if new <= full then
      local nd = at + new
      rem = min(floor((full - new) / a), size)
      reset = nd - min(now, nd)
      v1, v2, exp = nd, at, nd
    else
      ok = false
      retry = NEVER
      if cost * a <= full then retry = (at - now) + (new - full) end
      rem = min(floor((full - min(level, full)) / a), size)
      reset = (at - now) + level
    end
  elseif code == 4 then
    local e, count = 0, 0
    if state and #state >= 24 then e, count, known = bunpack('>ddd', state) end
    if now >= e then
      e, count = now - fmod(now, a) + a, 0
    end
    reset = e - now
    local total = count + cost
    if total <= size then
      rem = size - total
      v1, v2, exp = e, total, e
    else
      ok = false
      rem = max(size - count, 0)
      retry = reset
      if cost > size then retry = NEVER end
    end
  else -- 6: sliding window counter
    local w = a
    local e, cur, prev
    e, cur, prev, known = slide(state, w, now)
    local start = e - w
    local elapsed = max(now, start) - start
    -- prev*(W-elapsed) + (cur+cost)*W <= size*W: exact while the products
    -- stay below 2^53, else divided by W in floating point.
    local wp = prev * (w - min(elapsed, w))
    local weighted = wp / w
    local estimate = math.ceil(weighted) + cur
    reset = e + w - min(now, e)
    local lhs, rhs = wp + (cur + cost) * w, size * w
    if lhs < 9007199254740992 and rhs < 9007199254740992 then
      ok = lhs <= rhs
    else
      ok = weighted + cur + cost <= size
    end
    if ok then
      rem = max(size - (estimate + cost), 0)
      v1, v2, v3, exp = e + w, min(cur + cost, 4294967295), prev, e + w
    else
      rem = max(size - estimate, 0)
      retry = NEVER
      if cost <= size then
        -- The earliest time `avail` fits beside a window of `p` sliding out.
        local at
        if cur + cost <= size then
          at = start
          if prev > 0 then at = at + max(w - floor((size - cur - cost) * w / prev), 0) end
        else
          at = start + w
          if cur > 0 then at = at + max(w - floor((size - cost) * w / cur), 0) end
        end
        retry = at - now
      end
    end
  end
  out[o + 1] = ok and 1 or 0
  out[o + 2] = rem
  out[o + 3] = reset
  out[o + 4] = retry
  out[o + 5] = wait
  return exp, known, v1, v2, v3
end

-- How many numbers each counter algorithm's state has (before `known`).
local NUMBERS = { 1, 2, 1, 2, 0, 3, 1 }

-- A state as stored: its numbers, then until when its bucket is known to
-- live.
local function packed(code, known, v1, v2, v3)
  local k = NUMBERS[code]
  if k == 1 then return bpack('>dd', v1, known) end
  if k == 2 then return bpack('>ddd', v1, v2, known) end
  return bpack('>dddd', v1, v2, v3, known)
end

-- The bucket must outlive every state in it. A state that would expire
-- by `known` (until when its last write made sure the bucket lives) is
-- written with one call. Otherwise the bucket is set to live until the
-- state expires and half as long again (at least 5 s more: buckets are
-- few and shared, so a longer life costs little and spares calls), with
-- PEXPIRE GT (a TTL only grows) when the state existed, so the bucket has
-- a TTL. A new state reads the bucket's "~" field first (until when it
-- was last set to live); a bucket without "~" may be new, without a TTL
-- (PEXPIRE NX first).
local function store(key, field, code, e, now, known, v1, v2, v3)
  local added
  if known and e <= known then
    added = redis.call('HSET', key, field, packed(code, known, v1, v2, v3))
  else
    local life = max(e, now) + max(floor((e - now) / 2), 5000000)
    local ttl = max(math.ceil((life - now) / 1000), 1)
    if known then
      added = redis.call('HSET', key, field, packed(code, life, v1, v2, v3))
      redis.call('PEXPIRE', key, ttl, 'GT')
    else
      local stamp = first(redis.call('HGET', key, '~'))
      if stamp and e <= stamp then
        added = redis.call('HSET', key, field, packed(code, stamp, v1, v2, v3))
      else
        added = redis.call('HSET', key, field, packed(code, life, v1, v2, v3), '~', bpack('>d', life))
        if stamp or redis.call('PEXPIRE', key, ttl, 'NX') == 0 then
          redis.call('PEXPIRE', key, ttl, 'GT')
        end
      end
    end
  end
  -- Small buckets are left alone: at most 8 fields each, live or not, is a
  -- bounded cost (8 x buckets), and sweeping them was most of the sweeps'
  -- work under churn.
  if added >= 1 and now % 4 == 0 and redis.call('HLEN', key) > 9 then
    -- Sweep: drop expired fields among up to 16, sparing this one and "~".
    local sample = redis.call('HRANDFIELD', key, 16, 'WITHVALUES')
    local gone = {}
    for s = 1, #sample, 2 do
      if sample[s] ~= field and sample[s] ~= '~' then
        local e = first(sample[s + 1])
        if e and e <= now then gone[#gone + 1] = sample[s] end
      end
    end
    if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
  end
end

-- A sliding log is a list of runs, oldest first: equal admission times
-- are stored once, with a count, so a request of any cost adds at most
-- one element and a log's memory grows with how many requests it
-- admitted, never with what they cost (one element per unit let a
-- single `cost: 100000` take 100,000 elements). A run is 17 bytes
-- (RUN): 0 (a format mark: the old format stored each unit as its own
-- element, in decimal text), the time in microseconds, its count, and
-- the count through it since the list began modulo 2^32, so a log's
-- count is its newest run's minus what came before its oldest, and a
-- unit's run is found by binary search. A list in the old format is
-- rewritten in runs when first read (`log_migrate`): nothing it counted
-- is lost. (The old script cannot read runs: during a rolling upgrade an
-- instance still running it gets a script error, its store-error
-- policy, on a log a new instance has written.) Counts through are
-- kept modulo 2^32: a log holds at most 100,001 units, so differences
-- stay exact.
local RUN = '>BdI4I4'
local WRAP = 4294967296
local CHUNK = 16

-- A run's time, count and count through it.
local function run(e)
  local _, t, n, c = bunpack(RUN, e)
  return t, n, c
end

-- Rewrites a list of the old format (or one mixing both) in runs, its
-- TTL kept. Once per list: the script writes only runs.
local function log_migrate(key)
  local ttl = redis.call('PTTL', key)
  local all = redis.call('LRANGE', key, 0, -1)
  local ts, ns = {}, {}
  for i = 1, #all do
    local e, t, n = all[i], nil, 1
    if string.byte(e, 1) == 0 then t, n = run(e) else t = tonumber(e) end
    if #ts > 0 and t <= ts[#ts] then
      ns[#ns] = ns[#ns] + n
    else
      ts[#ts + 1], ns[#ns + 1] = t, n
    end
  end
  redis.call('DEL', key)
  local items, c = {}, 0
  for i = 1, #ts do
    c = (c + ns[i]) % WRAP
    items[i] = bpack(RUN, 0, ts[i], ns[i], c)
  end
  local i = 1
  while i <= #items do
    local e = min(i + 999, #items)
    redis.call('RPUSH', key, unpack(items, i, e))
    i = e + 1
  end
  if #items > 0 and ttl > 0 then redis.call('PEXPIRE', key, ttl) end
end

-- Reads a sliding log: its count of units, how many of its oldest units
-- have left the window, its newest time, its first elements as read,
-- how many elements hold the units that left, the count before its
-- oldest unit, its newest run's count and count through, and its number
-- of elements. A short log (the usual case) is one LRANGE. A long one is
-- read from its head in chunks only as far as its first live run, plus
-- LLEN and its newest run: a log of 500 runs costs a few calls, not 500
-- values.
local function log_read(key, a, now)
  local head = redis.call('LRANGE', key, 0, CHUNK - 1)
  local elems = #head
  if elems == 0 then return 0, 0, nil, head, 0, 0, 0, 0, 0 end
  local last = head[elems]
  if elems == CHUNK then
    elems = redis.call('LLEN', key)
    if elems > CHUNK then last = redis.call('LINDEX', key, -1) end
  end
  if string.byte(head[1], 1) ~= 0 or string.byte(last, 1) ~= 0 then
    log_migrate(key)
    return log_read(key, a, now)
  end
  local _, n1, c1 = run(head[1])
  local c0 = (c1 - n1) % WRAP
  local newest, nlast, clast = run(last)
  local len = (clast - c0) % WRAP
  local dead, drop, from, part = 0, 0, 0, head
  while true do
    local live = false
    for i = 1, #part do
      local t, _, c = run(part[i])
      if t + a <= now then
        dead, drop = (c - c0) % WRAP, from + i
      else
        live = true
        break
      end
    end
    if live or from + #part >= elems then break end
    from = from + CHUNK
    part = redis.call('LRANGE', key, from, from + CHUNK - 1)
  end
  return len, dead, newest, head, drop, c0, nlast, clast, elems
end

-- The run holding unit i (from 1, counted from the list's oldest unit):
-- its index (from 0), time, count and count through. From the first
-- elements if it is among them, else by binary search.
local function log_at(key, head, i, c0, elems)
  for j = 1, #head do
    local t, n, c = run(head[j])
    if (c - c0) % WRAP >= i then return j - 1, t, n, c end
  end
  local lo, hi = #head, elems - 1
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    local _, _, c = run(redis.call('LINDEX', key, mid))
    if (c - c0) % WRAP >= i then hi = mid else lo = mid + 1 end
  end
  local t, n, c = run(redis.call('LINDEX', key, lo))
  return lo, t, n, c
end

-- The time of unit i (see `log_at`).
local function log_entry(key, head, i, c0, elems)
  local _, t = log_at(key, head, i, c0, elems)
  return t
end

-- Appends `cnt` units at time `t` to a sliding log whose newest run (if
-- it has any) is at `last` with count `nlast` and count through `clast`:
-- onto that run if `t` is its time, else as a run of its own. Makes the
-- list live until the newest leaves the window.
local function log_push(key, t, cnt, a, now, last, nlast, clast)
  if last and t == last then
    redis.call('LSET', key, -1, bpack(RUN, 0, t, nlast + cnt, (clast + cnt) % WRAP))
  else
    if not last then clast = 0 end
    redis.call('RPUSH', key, bpack(RUN, 0, t, cnt, (clast + cnt) % WRAP))
  end
  redis.call('PEXPIRE', key, max(math.ceil((t + a - now) / 1000), 1))
end

-- Drops the `k` oldest units of a log of `len` units read by
-- `log_read` (0 < k): whole runs, and part of the run that holds unit
-- k + 1. Returns what is left of the newest run: its time (nil if
-- nothing is left), count and count through.
local function log_drop(key, k, len, head, c0, elems, newest, nlast, clast)
  if k >= len then
    redis.call('DEL', key)
    return nil, 0, 0
  end
  local idx, t, n, c = log_at(key, head, k + 1, c0, elems)
  if idx > 0 then redis.call('LTRIM', key, idx, -1) end
  local keep = (c - c0 - k) % WRAP
  if keep ~= n then
    redis.call('LSET', key, 0, bpack(RUN, 0, t, keep, c))
    if idx == elems - 1 then nlast = keep end
  end
  return newest, nlast, clast
end

-- Charges `cost` after the fact to a sliding log of limit `size`: keeps
-- its newest `size + 1` units (a check asks for at most `size` live
-- ones and units leave oldest first, so these answer every later check
-- as the whole log would).
local function log_charge(key, size, a, now, cost)
  local keep = size + 1
  local len, dead, newest, head, _, c0, nlast, clast, elems = log_read(key, a, now)
  local live = len - dead
  local cnt = min(cost, keep)
  local t = now
  if live > 0 then t = max(now, newest) end
  local drop = dead + max(live + cnt - keep, 0)
  local last = nil
  if len > 0 then last = newest end
  if drop > 0 then
    last, nlast, clast = log_drop(key, drop, len, head, c0, elems, newest, nlast, clast)
  end
  if cnt > 0 then log_push(key, t, cnt, a, now, last, nlast, clast) end
end

-- A check of cost 0 on a sliding log of limit `size`, written to
-- out[o + 1 .. o + 5].
local function log_check(out, o, key, size, a, now)
  local len, dead, newest, head, _, c0, _, _, elems = log_read(key, a, now)
  local count = len - dead
  local newest_end = 0
  if len > 0 then newest_end = newest + a end
  if count <= size then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 1, size - count, max(now + a, newest_end) - now, 0
  else
    local retry = max(log_entry(key, head, dead + count - size, c0, elems) + a - now, 0)
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 0, 0, max(newest_end - now, 0), retry
  end
  out[o + 5] = 0
end

-- The furthest a charge takes a time-based state (a schedule or a leaky
-- bucket's level) past now, in microseconds, whatever its horizon and
-- max_debt: 2^51, about 71 years. A charge whose cost times the period
-- would reach further is capped there, so every number stays an exact
-- integer (now + 1.5 x this, the bucket's life, is below 2^53 until the
-- year 2148) and every TTL a valid PEXPIRE; without it a cost of 2^53
-- made PEXPIRE fail the call, and the charge was lost. A count (fixed
-- window) stops at 2^53 - 1.
local DEBT = 2251799813685248
local MAX_COUNT = 9007199254740991
local MAX_U32 = 4294967295

-- floor(x * y / z), exactly, for whole x below 2^32 and 0 < z <= y
-- below 2^51 (a double holds products only to 2^53): y / z's quotient
-- and remainder r, then x * r / z by long multiplication over x's bits.
local function muldiv(x, y, z)
  local q1 = floor(y / z)
  local r = y - q1 * z
  if r < 0 then
    q1, r = q1 - 1, r + z
  elseif r >= z then
    q1, r = q1 + 1, r - z
  end
  local hi = x * q1
  if hi >= MAX_U32 then return MAX_U32 end
  local q, acc, rest, p = 0, 0, x, 2147483648
  for _ = 1, 32 do
    q, acc = q * 2, acc * 2
    if rest >= p then
      rest, acc = rest - p, acc + r
    end
    while acc >= z do
      acc, q = acc - z, q + 1
    end
    p = p / 2
  end
  return hi + q
end

-- The largest count a charge leaves in a sliding counter's window of
-- `w` microseconds and limit `size`, `left` of which is still to come,
-- so that it keeps the key out at most `d` (its max_debt) from the
-- charge, as crates/spillway-core's `SlidingCounter::max_count_at`:
-- `size x w / (w - d')` with `d' = d - left`, at least `size + 1` (a
-- charge past the limit leaves the key over it), none (2^32 - 1) once
-- `d' >= w`.
local function counter_cap(size, w, d, left)
  local dl = d - min(left, w)
  if dl >= w then return MAX_U32 end
  if dl < 0 then dl = 0 end
  local x
  if w >= 2251799813685248 then x = floor(size * w / (w - dl)) else x = muldiv(size, w, w - dl) end
  return min(max(x, size + 1), MAX_U32)
end

-- Charges `cost` after the fact to a counter algorithm's `state` of
-- enforced size `size`, owing at most `d` (see the header): the state's
-- expiry, until when its bucket is known to live, and its numbers (as
-- `counter` returns them for an admission). `cost` is below 2^53;
-- `cost * a` may not be exact, but then it is past the cap (rounding
-- keeps the order), and the cap is what is kept. A cap never lowers a
-- state (a clock that stepped back, or a debt set smaller since).
local function charged(code, state, size, a, d, now, cost)
  if code == 1 or code == 3 or code == 7 then
    local tat, known = 0, nil
    if state and #state >= 16 then tat, known = bunpack('>dd', state) end
    local start = max(tat, now)
    local e = start + cost * a
    local cap = max(start, now + min(size * a + d, DEBT))
    if e > cap then e = cap end
    return e, known, e
  elseif code == 2 then
    local drains, measured, known = 0, 0, nil
    if state and #state >= 24 then drains, measured, known = bunpack('>ddd', state) end
    local at = max(now, measured)
    local level = max(max(drains - measured, 0) - (at - measured), 0)
    local new = min(level + cost * a, max(level, min(size * a + d, DEBT)))
    local nd = at + new
    return nd, known, nd, at
  elseif code == 4 then
    local e, count, known = 0, 0, nil
    if state and #state >= 24 then e, count, known = bunpack('>ddd', state) end
    if now >= e then e, count = now - fmod(now, a) + a, 0 end
    return e, known, e, min(count + cost, MAX_COUNT)
  end
  -- 6: sliding window counter, rolled forward as `counter` does.
  local e, cur, prev, known = slide(state, a, now)
  return e + a, known, e + a, min(cur + cost, max(counter_cap(size, a, d, e - now), cur)), prev
end

-- Refunds `cost` units taken at `since` from a counter algorithm's
-- `state` (see the header): what `charged` returns, or nil when the
-- state has nothing to give back (then it is left alone).
local function refunded(code, state, a, now, cost, since)
  if code == 1 or code == 3 or code == 7 then
    if not (state and #state >= 16) then return nil end
    local tat, known = bunpack('>dd', state)
    if tat <= now then return nil end
    local e = max(now, tat - cost * a)
    return e, known, e
  elseif code == 2 then
    if not (state and #state >= 24) then return nil end
    local drains, measured, known = bunpack('>ddd', state)
    local at = max(now, measured)
    local level = max(max(drains - measured, 0) - (at - measured), 0)
    if level == 0 then return nil end
    local nd = at + max(level - cost * a, 0)
    return nd, known, nd, at
  elseif code == 4 then
    if not (state and #state >= 24) then return nil end
    local e, count, known = bunpack('>ddd', state)
    -- Only the window that counted the units gives them back.
    if now >= e or since < e - a or since >= e or count == 0 then return nil end
    return e, known, e, max(count - cost, 0)
  end
  -- 6: sliding window counter, rolled forward as `counter` does: the
  -- units are in the window that holds `since`, if it still counts.
  if not state then return nil end
  local e, cur, prev, known = slide(state, a, now)
  local start = e - a
  if since >= start and since < e then
    if cur == 0 then return nil end
    cur = max(cur - cost, 0)
  elseif since >= start - a and since < start then
    if prev == 0 then return nil end
    prev = max(prev - cost, 0)
  else
    return nil
  end
  return e + a, known, e + a, cur, prev
end

-- Refunds `cost` units taken at or after `since` from a sliding log:
-- drops its oldest `cost` units at or after `since` (runs are in time
-- order, so they make the list's tail). Of all choices of that many
-- units from `since` on, dropping the oldest leaves, at every later
-- time, at least as many live units as dropping the lease's own would:
-- a refund never admits more later than the true units would. And
-- refunds of several instances, each dated at its oldest grant still
-- held, all find their units however they interleave (dropping the
-- newest instead, one instance's refund can take units another's made,
-- and that one's refund then finds too few: budget lost). The tail from
-- `since` is read in chunks and written back without the dropped units,
-- its counts through renumbered.
local function log_refund(key, since, cost, a, now)
  if cost <= 0 then return end
  local _, _, _, _, _, _, _, _, elems = log_read(key, a, now)
  local ts, ns, cs = {}, {}, {}
  local m = 0
  while m < elems do
    local c = min(CHUNK, elems - m)
    local part = redis.call('LRANGE', key, -(m + c), -(m + 1))
    local older = false
    for i = #part, 1, -1 do
      local t, n, cc = run(part[i])
      if t < since then
        older = true
        break
      end
      m = m + 1
      ts[m], ns[m], cs[m] = t, n, cc
    end
    if older or #part < c then break end
  end
  if m == 0 then return end
  local k, c = cost, (cs[m] - ns[m]) % WRAP
  local keep = {}
  for i = m, 1, -1 do
    local d = min(k, ns[i])
    k = k - d
    if ns[i] > d then
      c = (c + ns[i] - d) % WRAP
      keep[#keep + 1] = bpack(RUN, 0, ts[i], ns[i] - d, c)
    end
  end
  if m >= elems then
    redis.call('DEL', key)
  else
    redis.call('LTRIM', key, 0, -(m + 1))
  end
  -- RPUSH in chunks: Lua's unpack has a stack limit. The newest run is
  -- kept when any is, and with it the list's TTL; a list emptied and
  -- refilled gets the TTL of its newest run again.
  local i = 1
  while i <= #keep do
    local e = min(i + 999, #keep)
    redis.call('RPUSH', key, unpack(keep, i, e))
    i = e + 1
  end
  if m >= elems and #keep > 0 then
    local newest = run(keep[#keep])
    redis.call('PEXPIRE', key, max(math.ceil((newest + a - now) / 1000), 1))
  end
end

-- How long the sync header's hash keeps an instance's sequence number
-- after its last write, in microseconds: a day.
local SEQ_LIFE = 86400000000

local time_now = nil

-- This server's TIME in microseconds, read once per call (instances with
-- skewed clocks then agree).
local function clock()
  if not time_now then
    local t = redis.call('TIME')
    time_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return time_now
end

local A = cmsgpack.unpack(ARGV[1])
-- Rule r's mode at A[RS[r]], its number of limits after it, then six
-- numbers per limit.
local RS = {}
local p = 2
for r = 1, A[1] do
  RS[r] = p
  p = p + 2 + 6 * A[p + 1]
end
local ndecisions = A[p]
p = p + 1

-- Tables are made with room for one rule of one limit (the common case):
-- growing them one entry at a time reallocates, and together with a table
-- per field below that cost a third of the script's own time (measured).
local out = { 0, 0, 0, 0, 0 }
local n = 0
-- Per limit k of a decision, at L[10k - 9 .. 10k]: code, key, field,
-- enforced size, a, then for a counter what `counter` returns (expiry,
-- known life, the state's numbers), for a sliding log how many of its
-- elements hold units that left the window, how many
-- units are live, its newest run's time, count and count through (at 6
-- to 10). Per rule r, at
-- R[3r - 2 .. 3r]: charged or not, its first limit, its number of limits.
-- Reused by each decision in turn.
local L = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
local R = { false, 0, 0 }

-- Decides a request of `cost` at `now` over the `nrules` rules of the
-- decision whose first rule number is at A[p], its keys from
-- KEYS[kb + 1]: writes the verdicts from out[n + 1] and, if every rule
-- admits it and not `dry`, charges the rules to charge. The general
-- case: any number of rules, limits and modes. Returns where the next
-- decision's rules start in A, the next free place in out, how many
-- keys it used, and whether the request was admitted.
local function decide(p, n, kb, nrules, now, cost, dry)
  -- Locals, not upvalues, in the loops below.
  local A, RS, KEYS, out, L, R = A, RS, KEYS, out, L, R
  local k = 1
  local allowed = true
  for r = 1, nrules do
    local rp = RS[A[p]]
    p = p + 1
    local mode, nl = A[rp], A[rp + 1]
    rp = rp + 2
    R[3 * r - 1], R[3 * r] = k, nl
    local hard_ok, enf_ok = true, true
    -- A soft rule's limits get two verdicts: raised, and as written.
    local two = mode == 1
    for _ = 1, nl do
      local code, base, enf, a, b = A[rp], A[rp + 1], A[rp + 2], A[rp + 3], A[rp + 4]
      rp = rp + 6
      local field = A[p]
      p = p + 1
      local key = KEYS[kb + k]
      local q = 10 * k - 10
      L[q + 1], L[q + 2], L[q + 3], L[q + 4], L[q + 5] = code, key, field, enf, a
      if code == 5 then
        -- The sliding log: a list of admission times, oldest first.
        local len, dead, newest, head, drop, c0, nlast, clast, elems = log_read(key, a, now)
        L[q + 6], L[q + 7], L[q + 8], L[q + 9], L[q + 10] = drop, len - dead, newest, nlast, clast
        local count = len - dead
        local newest_end = 0
        if len > 0 then newest_end = newest + a end
        for pass = 1, two and 2 or 1 do
          local size, o = enf, n
          if pass == 2 then size, o = base, n + 5 end
          local total = count + cost
          if total <= size then
            out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 1, size - total, max(now + a, newest_end) - now, 0
          else
            local retry = NEVER
            if cost <= size then retry = max(log_entry(key, head, dead + total - size, c0, elems) + a - now, 0) end
            out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 0, max(size - count, 0), max(newest_end - now, 0), retry
          end
          out[o + 5] = 0
        end
      else
        local state = redis.call('HGET', key, field)
        L[q + 6], L[q + 7], L[q + 8], L[q + 9], L[q + 10] = counter(out, n, code, state, enf, a, b, now, cost)
        if two then counter(out, n + 5, code, state, base, a, b, now, cost) end
      end
      enf_ok = enf_ok and out[n + 1] == 1
      if two then
        hard_ok = hard_ok and out[n + 6] == 1
        n = n + 10
      else
        hard_ok = hard_ok and out[n + 1] == 1
        n = n + 5
      end
      k = k + 1
    end
    local charge, admits = hard_ok, hard_ok
    if mode == 1 then
      charge, admits = enf_ok, enf_ok
    elseif mode == 2 then
      admits = true
    end
    R[3 * r - 2] = charge
    allowed = allowed and admits
  end

  if allowed and not dry then
    for r = 1, nrules do
      if R[3 * r - 2] then
        for j = R[3 * r - 1], R[3 * r - 1] + R[3 * r] - 1 do
          local q = 10 * j - 10
          local key, a = L[q + 2], L[q + 5]
          if L[q + 1] == 5 then
            local drop, live, newest = L[q + 6], L[q + 7], L[q + 8]
            if drop > 0 then redis.call('LTRIM', key, drop, -1) end
            local t, last = now, nil
            if live > 0 then t, last = max(now, newest), newest end
            log_push(key, t, min(cost, L[q + 4]), a, now, last, L[q + 9], L[q + 10])
          else
            store(key, L[q + 3], L[q + 1], L[q + 6], now, L[q + 7], L[q + 8], L[q + 9], L[q + 10])
          end
        end
      end
    end
  end
  return p, n, k - 1, allowed
end

-- The most a lease over the decision's rules (first rule number at
-- A[p]) may take: the smallest `remaining` of the checks of cost 0
-- written from out[n + 1] by `decide`, over the limits of its hard and
-- soft rules (a soft rule's first verdict, under its enforced size), 0
-- for a refused check; huge when only shadow rules apply.
local function room(p, n, nrules)
  local m = math.huge
  for _ = 1, nrules do
    local rp = RS[A[p]]
    local mode, nl = A[rp], A[rp + 1]
    p = p + 1 + nl
    for _ = 1, nl do
      if mode ~= 2 then
        local rem = 0
        if out[n + 1] == 1 then rem = out[n + 2] end
        if rem < m then m = rem end
      end
      if mode == 1 then n = n + 10 else n = n + 5 end
    end
  end
  return m
end

-- The sync header (see the top): applied or not, and TIME, first in the
-- reply. Without it, this one lookup is all it costs.
local instance = ARGV[2]
if instance then
  local now = clock()
  local applied = 1
  if instance ~= '' then
    local seqs = KEYS[#KEYS]
    local seq = tonumber(ARGV[3])
    local last = first(redis.call('HGET', seqs, instance))
    if last and seq <= last then
      -- A push seen already: every decision a check of cost 0 at TIME
      -- (a lease keeps its flag: of 0 units it takes none).
      applied = 0
      local q = p
      for _ = 1, ndecisions do
        if A[q + 2] ~= 4 then A[q + 2] = 1 end
        A[q], A[q + 1] = 0, 0
        local nrules = A[q + 3]
        q = q + 4
        for _ = 1, nrules do q = q + 1 + A[RS[A[q]] + 1] end
      end
    else
      redis.call('HSET', seqs, instance, bpack('>dd', seq, now))
      redis.call('PEXPIRE', seqs, SEQ_LIFE / 1000)
      if redis.call('HLEN', seqs) > 8 then
        local sample = redis.call('HRANDFIELD', seqs, 16, 'WITHVALUES')
        local gone = {}
        for s = 1, #sample, 2 do
          local v = sample[s + 1]
          if #v < 16 or select(2, bunpack('>dd', v)) + SEQ_LIFE <= now then gone[#gone + 1] = sample[s] end
        end
        if #gone > 0 then redis.call('HDEL', seqs, unpack(gone)) end
      end
    end
  end
  out[1], out[2] = applied, now
  n = 2
end

local key_base = 0

for _ = 1, ndecisions do
  local at = A[p]
  local now = at
  if now == 0 then now = time_now or clock() end
  local cost = A[p + 1]
  local flag = A[p + 2]
  local nrules = A[p + 3]
  p = p + 4

  local rp1 = nrules == 1 and RS[A[p]]
  if flag == 4 then
    -- A lease: a check of cost 0 first, then a request of what it admits.
    local g = n + 1
    n = n + 1
    local next_p, next_n, used = decide(p, n, key_base, nrules, now, 0, true)
    local c = min(cost, room(p, n, nrules))
    if c >= 1 then
      local _, _, _, ok = decide(p, n, key_base, nrules, now, c, false)
      if not ok then
        c = 0
        decide(p, n, key_base, nrules, now, 0, true)
      end
    end
    out[g] = c
    p, n, key_base = next_p, next_n, key_base + used
  elseif flag >= 2 then
    -- A charge after the fact (2) or a refund (3): every limit of every
    -- rule (shadow ones too), whatever its state; then a check of cost 0
    -- of each.
    local refund = flag == 3
    if refund then now = clock() end
    local k = 1
    for _ = 1, nrules do
      local rp = RS[A[p]]
      p = p + 1
      local two, nl = A[rp] == 1, A[rp + 1]
      rp = rp + 2
      for _ = 1, nl do
        local code, base, enf, a, b, d = A[rp], A[rp + 1], A[rp + 2], A[rp + 3], A[rp + 4], A[rp + 5]
        rp = rp + 6
        local field = A[p]
        p = p + 1
        local key = KEYS[key_base + k]
        if code == 5 then
          if refund then
            log_refund(key, at, cost, a, now)
          else
            log_charge(key, enf, a, now, cost)
          end
          log_check(out, n, key, enf, a, now)
          if two then log_check(out, n + 5, key, base, a, now) end
        else
          local st = redis.call('HGET', key, field)
          local e, known, v1, v2, v3
          if refund then
            e, known, v1, v2, v3 = refunded(code, st, a, now, cost, at)
          else
            e, known, v1, v2, v3 = charged(code, st, enf, a, d, now, cost)
          end
          if e then
            store(key, field, code, e, now, known, v1, v2, v3)
            st = packed(code, known or 0, v1, v2, v3)
          end
          counter(out, n, code, st, enf, a, b, now, 0)
          if two then counter(out, n + 5, code, st, base, a, b, now, 0) end
        end
        n = n + (two and 10 or 5)
        k = k + 1
      end
    end
    key_base = key_base + k - 1
  elseif rp1 and A[rp1 + 1] == 1 and A[rp1] ~= 1 and A[rp1 + 2] ~= 5 then
    -- The common case, one rule of one counter limit, not soft: decided and
    -- written without the bookkeeping of the general case below (a tenth
    -- of the script's time per decision, measured).
    local key = KEYS[key_base + 1]
    local field = A[p + 1]
    p = p + 2
    local state = redis.call('HGET', key, field)
    local code = A[rp1 + 2]
    local e, known, v1, v2, v3 = counter(out, n, code, state, A[rp1 + 4], A[rp1 + 5], A[rp1 + 6], now, cost)
    if out[n + 1] == 1 and flag ~= 1 then store(key, field, code, e, now, known, v1, v2, v3) end
    n = n + 5
    key_base = key_base + 1
  else
    local used
    p, n, used = decide(p, n, key_base, nrules, now, cost, flag == 1)
    key_base = key_base + used
  end
end

-- (Fewer numbers than the placeholders: drop the rest.)
for i = n + 1, 5 do out[i] = nil end
-- One MessagePack string rather than a list: Redis would make a reply
-- element of each number and the client parse each one (a fifth of the
-- client's time per decision in profiles); packing costs Redis about as
-- much as the elements did.
return cmsgpack.pack(out)
