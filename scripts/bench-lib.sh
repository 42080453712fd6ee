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
