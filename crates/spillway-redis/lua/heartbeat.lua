#!lua
-- (A writing script for Redis 7, as decide.lua: refused as a whole with
-- OOM or READONLY rather than half run.)
--
-- spillway: a local-first instance says it is alive.
--
-- KEYS[1]  the sorted set of live instances: each member an instance's
--          name, scored with the TIME (microseconds) of its last heartbeat;
--          and, as a member "\1" .. name, the TIME before which all it
--          admitted is in the store (below)
-- ARGV[1]  this instance's name
-- ARGV[2]  how long an instance counts as alive after its last heartbeat,
--          in microseconds, below 2^53, in decimal
-- ARGV[3]  (optional) "1" if every push this instance made before this
--          heartbeat has been applied (nothing waits to be sent)
--
-- Scores this instance with this server's TIME (instances with skewed
-- clocks agree), drops the members whose last heartbeat is older than the
-- given life, and makes the set live that long again (it vanishes with
-- its last instance: nothing grows unswept). Returns, packed with
-- MessagePack as decide.lua's reply, TIME, the instances left, and the
-- horizon: the earliest, over the live instances that say so, of the
-- TIME before which everything they admitted is in the store (0 if
-- none says).
--
-- Why an instance's previous heartbeat is that time: it exchanges, then
-- heartbeats, once per round, so a round's push holds what it admitted
-- before the round began, after its previous heartbeat was answered; a
-- heartbeat saying every push was applied moves its time up to the
-- previous heartbeat, one that does not leaves it. An eventual instance
-- opens a key gated at a window's start only once the horizon has passed
-- its own first exchange of it (crates/spillway-sync, `gate`): every
-- live instance's first admissions are then in what it reads, however
-- late their exchanges came. An instance that has not said it yet (one
-- that just started, or runs an older script) is left out.
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local life = tonumber(ARGV[2])
local me = ARGV[1]
local last = redis.call('ZSCORE', key, me)
if ARGV[3] == '1' and last then
  redis.call('ZADD', key, tonumber(last), '\1' .. me)
end
redis.call('ZADD', key, now, me)
-- '(' excludes the bound: a member exactly `life` old is still alive.
-- (string.format: Lua's own number to string keeps only 14 digits.)
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. string.format('%d', now - life))
redis.call('PEXPIRE', key, math.max(math.ceil(life / 1000), 1))
local all = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
local alive, pushed = {}, {}
local n = 0
for i = 1, #all, 2 do
  local m = all[i]
  if string.byte(m, 1) == 1 then
    pushed[string.sub(m, 2)] = tonumber(all[i + 1])
  else
    alive[#alive + 1] = m
    n = n + 1
  end
end
local horizon = nil
for _, m in ipairs(alive) do
  local p = pushed[m]
  if p and (not horizon or p < horizon) then horizon = p end
end
return cmsgpack.pack({ now, n, horizon or 0 })
