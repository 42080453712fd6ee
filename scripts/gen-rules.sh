#!/usr/bin/env bash
# Writes N generated rules of mixed algorithms, keys, modes and one or two
# limits, as a rules file (or, with FILES > 1, a directory of FILES rules
# files, for `rules_dir:`), for the scale benchmark (scripts/bench-rules.sh).
# The same shapes as the scale test (crates/spillway/tests/it/scale.rs).
#
#   scripts/gen-rules.sh N OUT            # OUT: one rules file
#   scripts/gen-rules.sh N OUT FILES      # OUT: a directory of FILES files
set -euo pipefail
n=${1:?N}; out=${2:?OUT}; files=${3:-1}
gen() { # from to
  awk -v from="$1" -v to="$2" 'BEGIN {
    split("ip user user+ip header:X-Api-Key route", by, " ");
    print "rules:";
    for (i = from; i < to; i++) {
      printf "  - name: svc%d-rule-%d\n", i % 1000, i;
      printf "    api: %s /svc%d/v1/res%d\n", (i % 3 == 0 ? "POST" : "GET"), i % 1000, i;
      printf "    by: %s\n", by[i % 5 + 1];
      if (i % 10 == 3) print "    mode: shadow"; else if (i % 10 == 8) print "    mode: soft 10%";
      printf "    limits:\n";
      a = i % 6; l = 10 * (1 + i % 10);
      if (a == 0) printf "      - gcra: { rate: %d/s, burst: 5 }\n", l;
      else if (a == 1) printf "      - token_bucket: { capacity: %d, refill: 5/s }\n", l;
      else if (a == 2) printf "      - sliding_window_counter: { limit: %d, window: 1m }\n", l;
      else if (a == 3) printf "      - fixed_window: { limit: %d, window: 1h }\n", l;
      else if (a == 4) printf "      - leaky_bucket: { capacity: %d, leak: 2/s }\n", l;
      else printf "      - sliding_window_log: { limit: %d, window: 1m }\n", l % 50 + 1;
      if (i % 2 == 1) printf "      - fixed_window: { limit: %d, window: 1d }\n", 1000 * (1 + i % 4);
    }
  }'
}
if [ "$files" -le 1 ]; then
  gen 0 "$n" > "$out"
else
  mkdir -p "$out"
  per=$(( (n + files - 1) / files ))
  for ((f = 0; f < files; f++)); do
    from=$(( f * per )); to=$(( from + per < n ? from + per : n ))
    [ "$from" -lt "$to" ] || break
    gen "$from" "$to" > "$out/team-$(printf %04d "$f").yaml"
  done
fi
