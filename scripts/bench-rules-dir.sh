#!/usr/bin/env bash
# A rules directory at scale (issue 36, item 6): N generated rules in FILES
# files (scripts/gen-rules.sh N DIR FILES) served with `--config DIR` by the
# release binary, default settings (reload.quiet 2s), measuring
#   load_s     seconds from start until /healthz answers,
#   MiB        the server's RSS then,
#   apply_s    seconds from a one-file change (a rule added to the first
#              file, written aside and renamed in) until the new rule
#              decides: the quiet period, the reading of that one file,
#              the composition of the rule set,
#   pause_ms   the longest a client deciding every 5 ms waited meanwhile
#              (p50_ms: its median wait),
#   idle_cpu   the share of one core the idle server uses over IDLE seconds
#              (the watcher's polling of the files).
#
# Needs python3. SPILLWAY_BIN=FILE measures another binary (default
# target/release/spillway, built if missing).
# Usage: FILES=100 scripts/bench-rules-dir.sh [COUNTS...]   (default 1000000)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
bin=${SPILLWAY_BIN:-target/release/spillway}
[ -x "$bin" ] || cargo build --release --locked -q --bin spillway
counts=("$@"); [ ${#counts[@]} -gt 0 ] || counts=(1000000)
files=${FILES:-100}
idle=${IDLE:-10}

printf '%-9s %6s %8s %7s %8s %9s %7s %9s\n' rules files load_s MiB apply_s pause_ms p50_ms idle_cpu
for n in "${counts[@]}"; do
  rm -rf "$work/dir"
  scripts/gen-rules.sh "$n" "$work/dir" "$files"
  port=$(free_port)
  t0=$(date +%s.%N)
  "$bin" serve --config "$work/dir" --listen "127.0.0.1:$port" >"$work/log" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$port/healthz" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$work/log" >&2; exit 1; }
    sleep 0.05
  done
  t1=$(date +%s.%N)
  load=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b-a}')
  sleep 2
  mib=$(awk '/^VmRSS/ {printf "%.0f", $2/1024}' "/proc/$pid/status")
  hz=$(getconf CLK_TCK)
  c0=$(cpu_ticks "$pid"); sleep "$idle"; c1=$(cpu_ticks "$pid")
  idle_cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" -v s="$idle" 'BEGIN {printf "%.1f%%", (b-a)/hz/s*100}')
  set -- "$work"/dir/*.yaml; first=$(basename "$1")
  # A client deciding the new rule's request every 5 ms on its own
  # connection: the time from the rename until it decides, and the
  # longest wait meanwhile.
  python3 - "$port" "$work/dir/$first" > "$work/apply" <<'PY'
import http.client, os, sys, time
port, path = int(sys.argv[1]), sys.argv[2]
body = '{"api":"GET /added/rule","user":"u1","ip":"10.0.0.1"}'
c = http.client.HTTPConnection("127.0.0.1", port)
def ask():
    c.request("POST", "/v1/check", body, {"content-type": "application/json"})
    r = c.getresponse(); return r.read()
assert b"added-rule" not in ask()
text = open(path).read() + "  - name: added-rule\n    api: GET /added/rule\n    by: ip\n    limits: [ { fixed_window: { limit: 1000, window: 1h } } ]\n"
tmp = os.path.join(os.path.dirname(path), ".added.tmp")
open(tmp, "w").write(text)
t0 = time.perf_counter()
os.rename(tmp, path)
waits = []
while True:
    t = time.perf_counter()
    got = ask()
    waits.append(time.perf_counter() - t)
    if b"added-rule" in got:
        break
    assert time.perf_counter() - t0 < 600, "not applied in 10 minutes"
    time.sleep(0.005)
applied = time.perf_counter() - t0
waits.sort()
print(f"{applied:.2f} {waits[-1]*1000:.1f} {waits[len(waits)//2]*1000:.2f}")
PY
  read -r apply pause p50 < "$work/apply"
  printf '%-9s %6s %8s %7s %8s %9s %7s %9s\n' "$n" "$files" "$load" "$mib" "$apply" "$pause" "$p50" "$idle_cpu"
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
