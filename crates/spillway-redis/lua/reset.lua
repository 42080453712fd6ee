-- spillway: forgets one client's state under one rule, so it starts
-- afresh (an operator's reset).
--
-- KEYS[i]  where the rule's i-th limit lives: the bucket hash that holds
--          its state in one field, or a sliding log's own list
-- ARGV[i]  the i-th limit's field in its bucket, or empty for a sliding
--          log (its list is deleted whole)
--
-- Every key is in the client's bucket's cluster slot (they share its hash
-- tag), so one call serves a cluster. The bucket's TTL is left as it is:
-- it covers the other fields, and a fresh state needs none. No `#!lua`
-- line: HDEL and DEL free memory, so a reset may run even when a full
-- server refuses every decision.
--
-- Returns how many states were there.
local gone = 0
for i, key in ipairs(KEYS) do
  local field = ARGV[i]
  if field == '' then
    gone = gone + redis.call('DEL', key)
  else
    gone = gone + redis.call('HDEL', key, field)
  end
end
return gone
