# Helpers sourced by the bench-*.sh scripts.

# A port free on 127.0.0.1 right now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits (up to 10 s) until something listens on 127.0.0.1:$1.
wait_port() { for _ in $(seq 100); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

# User + system CPU ticks used so far by process $1.
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

# A temporary directory in $work, removed (with every background job) on exit.
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# Starts a throwaway redis-server (no persistence) on a free port: sets
# $rp (its port) and $pid_redis.
start_redis() {
  rp=$(free_port)
  redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null 2>&1 &
  pid_redis=$!
  wait_port "$rp"
}

# Writes the benchmarks' rules file to $1: one GCRA rule by user, on the
# store given as a YAML value in $2 (default: the memory store).
bench_rules() {
  cat > "$1" <<YAML
store: ${2:-memory}
rules:
  - name: bench
    by: user
    limits:
      - gcra: { rate: 100/1s, burst: 100 }
YAML
}

# Writes a wrk script to $1: POST /v1/check for one of 100,000 clients,
# at random: field $2 (default user) set to $3 (default u) and a number.
users_load() {
  cat > "$1" <<LUA
math.randomseed(os.time())
request = function()
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, '{"${2:-user}":"${3:-u}' .. math.random(1, 100000) .. '"}')
end
LUA
}

# Writes the proxy benchmarks' rules file to $1: the upstream on
# 127.0.0.1:$2, the user from X-Api-Key, one GCRA rule by user.
proxy_rules() {
  cat > "$1" <<YAML
proxy:
  upstream: http://127.0.0.1:$2
  user: header:X-Api-Key
rules:
  - name: api
    by: user
    limits:
      - gcra: { rate: 100/1s, burst: 100 }
YAML
}

# Writes a wrk script to $1: GET /api with X-Api-Key set to the Lua
# expression $2; with $3 = 1 the request carries an empty chunked body,
# which sends it to hyper on spillway's side.
proxy_lua() {
  local extra="" tail=""
  if [ "$3" = 1 ]; then extra=', ["Transfer-Encoding"] = "chunked"'; tail=' .. "0\r\n\r\n"'; fi
  cat > "$1" <<LUA
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/api", {["X-Api-Key"] = $2$extra})$tail
end
LUA
}

# The five hot-path cases of bench-ab.sh and bench-instructions.sh: their
# rules files and wrk scripts in $work, the upstream on 127.0.0.1:$1.
ab_cases() {
  bench_rules "$work/api.yaml"
  proxy_rules "$work/proxy.yaml" "$1"
  users_load "$work/api.lua"
  proxy_lua "$work/proxy-allow.lua" '"k" .. math.random(1, 100000)' 0
  proxy_lua "$work/proxy-deny.lua" '"one-key"' 0
  proxy_lua "$work/hyper-allow.lua" '"k" .. math.random(1, 100000)' 1
  proxy_lua "$work/hyper-deny.lua" '"one-key"' 1
}

# Per-round ratios of the rps of the result lines starting "$2" to those
# starting "$3" in file $1 (round by round, in order), then their median:
# prints "per-round R1 R2 ..., median M".
ratios_median() {
  local ratios median
  ratios=$(paste <(grep "^$2" "$1" | sed -E 's/.* rps=([^ ]+).*/\1/') \
                 <(grep "^$3" "$1" | sed -E 's/.* rps=([^ ]+).*/\1/') |
    awk '{printf "%.3f\n", $1 / $2}')
  median=$(sort -g <<<"$ratios" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  echo "per-round $(paste -sd' ' <<<"$ratios"), median $median"
}
