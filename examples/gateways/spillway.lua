-- Forward-auth to spillway from HAProxy 2.6+ (Lua 5.3, core.httpclient).
-- The call carries only what spillway reads, set from the request itself:
-- no client header reaches spillway but the API key (every copy of it, so
-- a key sent twice is refused, never counted as one while the app reads
-- the other). See docs/GATEWAYS.md.
local URL = os.getenv("SPILLWAY_FORWARD_AUTH") or "http://127.0.0.1:8080/v1/forward-auth"
-- With api.tokens: the token, e.g. from `setenv SPILLWAY_TOKEN ...`.
local TOKEN = os.getenv("SPILLWAY_TOKEN")

local function first(headers, name)
  local v = headers and headers[name]
  if type(v) == "table" then return v[0] or v[1] end
  return v
end

core.register_action("spillway", { "http-req" }, function(txn)
  local headers = {
    ["X-Forwarded-Method"] = { txn.sf:method() },
    ["X-Forwarded-Uri"] = { txn.sf:pathq() },
    ["X-Forwarded-Host"] = { txn.sf:req_fhdr("host") or "" },
    ["X-Forwarded-For"] = { txn.sf:src() },
  }
  local keys = txn.http:req_get_headers()["x-api-key"]
  if keys then
    local all = {}
    for _, v in pairs(keys) do all[#all + 1] = v end
    headers["X-Api-Key"] = all
  end
  if TOKEN then headers["Spillway-Authorization"] = { "Bearer " .. TOKEN } end
  -- `timeout` bounds a hung answer; a refused connection is retried by
  -- HAProxy's client for about 3 s before the request goes on.
  local ok, res = pcall(function()
    return core.httpclient():head{ url = URL, headers = headers, timeout = 500 }
  end)
  if not ok or not res or not res.status or res.status == 0 then
    txn:set_var("txn.spillway_status", 0)
    return
  end
  txn:set_var("txn.spillway_status", res.status)
  txn:set_var("txn.spillway_retry", first(res.headers, "retry-after") or "1")
  txn:set_var("txn.spillway_ratelimit", first(res.headers, "ratelimit") or "")
end, 0)
