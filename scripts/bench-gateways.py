#!/usr/bin/env python3
"""Side by side, per gateway, in one run: the gateway alone, with its own
limiter (nginx limit_req, Traefik rateLimit, HAProxy stick table; Caddy
has none), with spillway forward-auth (the shipped examples/gateways/
configs), and in front of `spillway proxy`. Requests/s at 32 connections,
p50 and p99 at 1 and at 32 connections (wrk), and each limiter's
exactness: how many of 150 requests sent at once a limit of 100 a minute
admits.

Usage: scripts/bench-gateways.py [--seconds 5] [--gateways nginx,traefik,caddy,haproxy]

Needs wrk and the gateways (scripts/setup.sh installs the gateways; wrk
is Debian's `wrk`). Everything binds free ports on 127.0.0.1; every
process started is stopped at the end. The app is a second nginx
answering 200 at once.
"""

import argparse
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "gateways"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, what, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"bench-gateways: {what} did not listen on {port}")


def binary(name):
    cache = Path(os.environ.get("SPILLWAY_GATEWAYS",
                                Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "spillway-gateways"))
    for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", str(cache / "bin")]:
        p = Path(d) / name
        if p.is_file():
            return str(p)
    sys.exit(f"bench-gateways: {name} not found: run scripts/setup.sh")


class Procs:
    def __init__(self):
        self.all = []

    def start(self, args, cwd, log):
        p = subprocess.Popen(args, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.all.append(p)
        return p

    def stop(self, p):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        self.all.remove(p)

    def stop_all(self):
        for p in list(self.all):
            self.stop(p)


# --- configs -------------------------------------------------------------

NGINX_HEAD = "daemon off;\nworker_processes 1;\nevents { worker_connections 1024; }\nhttp {\n  access_log off;\n"


def nginx_app(port):
    return NGINX_HEAD + f"  server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"ok\\n\"; }} }}\n}}\n"


def nginx_alone(gw, up, limiter=False):
    zone = "  limit_req_zone $http_x_api_key zone=keys:10m rate=100r/m;\n" if limiter else ""
    lim = "      limit_req zone=keys burst=99 nodelay;\n      limit_req_status 429;\n" if limiter else ""
    return NGINX_HEAD + zone + f"""  upstream app {{ server {up}; keepalive 32; }}
  server {{
    listen {gw};
    location / {{
{lim}      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""


def traefik_static(gw):
    return f'entryPoints:\n  web:\n    address: "{gw}"\nproviders:\n  file:\n    filename: traefik-dynamic.yml\nlog:\n  level: ERROR\n'


def traefik_alone(up, limiter=False):
    mw = "      middlewares: [limit]\n" if limiter else ""
    lim = """  middlewares:
    limit:
      rateLimit:
        average: 100
        period: 1m
        burst: 100
        sourceCriterion:
          requestHeaderName: X-Api-Key
""" if limiter else ""
    return f"""http:
  routers:
    app:
      entryPoints: [web]
      rule: "PathPrefix(`/`)"
{mw}      service: app
{lim}  services:
    app:
      loadBalancer:
        servers:
          - url: "http://{up}"
"""


def caddy_alone(gw, up):
    return f"{{\n\tadmin off\n\tauto_https off\n}}\nhttp://{gw} {{\n\treverse_proxy {up}\n}}\n"


def haproxy_alone(gw, up, limiter=False):
    lim = """  stick-table type string len 64 size 100k expire 2m store http_req_rate(1m)
  http-request track-sc0 req.hdr(x-api-key)
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 100 }
""" if limiter else ""
    return f"""defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
frontend web
  bind {gw}
{lim}  default_backend app
backend app
  http-reuse always
  server app1 {up}
"""


def ports_applied(text, spillway, app, gw):
    return (text.replace("127.0.0.1:8080", spillway).replace("127.0.0.1:3000", app)
            .replace("127.0.0.1:8000", gw))


def spillway_rules(example, limit_text):
    """The shipped forward-auth settings with `limit_text` as the rules."""
    text = (EXAMPLES / example).read_text()
    head = text.split("\nrules:")[0]
    return head + "\n" + limit_text


# Throughput: a rule that never denies (GCRA, 100/s per key, over 100,000
# keys at random, as the other benches); exactness: 100 a minute.
BENCH_RULES = "rules:\n  - name: bench\n    by: user\n    limits:\n      - gcra: { rate: 100/1s, burst: 100 }\n"
EXACT_RULES = "rules:\n  - name: exact\n    by: user\n    limits:\n      - sliding_window_log: { limit: 100, window: 1m }\n"

WRK_KEYS = """math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/bench", {["X-Api-Key"] = "k" .. math.random(1, 100000)})
end
"""


def wrk(url, conns, seconds, script):
    out = subprocess.run(["wrk", "-t", "1" if conns == 1 else "2", "-c", str(conns), "-d", f"{seconds}s",
                          "--latency", "-s", script, url], capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def pct(p):
        m = re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)", out)
        v, unit = float(m.group(1)), m.group(2)
        return v * {"us": 1, "ms": 1000, "s": 1e6}[unit]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return rps, pct(50), pct(99), int(non2xx.group(1)) if non2xx else 0


def admitted_of(gw_port, n=150):
    ok = 0
    for _ in range(n):
        c = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=10)
        c.request("GET", "/exact", headers={"X-Api-Key": "exact"})
        r = c.getresponse()
        r.read()
        ok += r.status == 200
        c.close()
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--gateways", default="nginx,traefik,caddy,haproxy")
    ap.add_argument("--spillway-threads", type=int, default=0,
                    help="spillway's --threads (0: its default, one per core)")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("bench-gateways: needs wrk (apt-get install wrk)")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "spillway"], cwd=ROOT, check=True)
    spillway = str(ROOT / "target" / "release" / "spillway")
    work = Path(tempfile.mkdtemp(prefix="bench-gateways-"))
    procs = Procs()
    script = work / "keys.lua"
    script.write_text(WRK_KEYS)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"# bench-gateways at {commit}, {args.seconds} s per run, {os.cpu_count()} cores, "
          f"spillway --threads {args.spillway_threads or 'default'}")
    print("| gateway | setup | req/s (32 conns) | p50 / p99 at 32 (µs) | p50 / p99 at 1 (µs) | non-2xx | admitted of 150 (limit 100/min) |")
    print("|---|---|---|---|---|---|---|")
    try:
        app_port = free_port()
        (work / "app").mkdir()
        (work / "app" / "nginx.conf").write_text(nginx_app(app_port))
        procs.start([binary("nginx"), "-c", str(work / "app" / "nginx.conf"), "-p", str(work / "app") + "/",
                     "-e", "stderr", "-g", f"pid {work}/app/nginx.pid;"], work / "app", work / "app.log")
        wait_port(app_port, "the app")
        app = f"127.0.0.1:{app_port}"
        for name in args.gateways.split(","):
            setups = ["alone", "own limiter", "forward-auth", "spillway proxy"]
            if name == "caddy":
                setups.remove("own limiter")
            for setup in setups:
                for phase in ("bench", "exact"):
                    if phase == "exact" and setup == "alone":
                        continue
                    d = work / f"{name}-{setup.replace(' ', '-')}-{phase}"
                    d.mkdir()
                    rules = BENCH_RULES if phase == "bench" else EXACT_RULES
                    own = []
                    upstream = app
                    sp_port = free_port()
                    if setup in ("forward-auth", "spillway proxy"):
                        example = "spillway-nginx.yaml" if name == "nginx" else "spillway.yaml"
                        text = spillway_rules(example, rules).replace("listen: 127.0.0.1:8080",
                                                                        f"listen: 127.0.0.1:{sp_port}")
                        if setup == "spillway proxy":
                            text += f"proxy:\n  upstream: http://{app}\n  user: header:X-Api-Key\n"
                            upstream = f"127.0.0.1:{sp_port}"
                        (d / "spillway.yaml").write_text(text)
                        sub = "serve" if setup == "forward-auth" else "proxy"
                        threads = ["--threads", str(args.spillway_threads)] if args.spillway_threads else []
                        own.append(procs.start([spillway, sub, "--config", str(d / "spillway.yaml"),
                                                "--listen", f"127.0.0.1:{sp_port}"] + threads, d,
                                               d / "spillway.log"))
                        wait_port(sp_port, "spillway")
                    gw_port = free_port()
                    gw = f"127.0.0.1:{gw_port}"
                    limiter = setup == "own limiter"
                    fa = setup == "forward-auth"
                    sp = f"127.0.0.1:{sp_port}"
                    if name == "nginx":
                        conf = ports_applied((EXAMPLES / "nginx.conf").read_text(), sp, upstream, gw) if fa \
                            else nginx_alone(gw, upstream, limiter)
                        (d / "nginx.conf").write_text(conf)
                        args_ = [binary("nginx"), "-c", str(d / "nginx.conf"), "-p", str(d) + "/", "-e", "stderr",
                                 "-g", f"pid {d}/nginx.pid;"]
                    elif name == "traefik":
                        (d / "traefik.yml").write_text(traefik_static(gw))
                        dyn = ports_applied((EXAMPLES / "traefik-dynamic.yml").read_text(), sp, upstream, gw) if fa \
                            else traefik_alone(upstream, limiter)
                        (d / "traefik-dynamic.yml").write_text(dyn)
                        args_ = [binary("traefik"), "--configFile=traefik.yml"]
                    elif name == "caddy":
                        conf = ports_applied((EXAMPLES / "Caddyfile").read_text(), sp, upstream, gw) if fa \
                            else caddy_alone(gw, upstream)
                        (d / "Caddyfile").write_text(conf)
                        args_ = [binary("caddy"), "run", "--config", "Caddyfile", "--adapter", "caddyfile"]
                    else:
                        if fa:
                            (d / "haproxy.cfg").write_text(
                                ports_applied((EXAMPLES / "haproxy.cfg").read_text(), sp, upstream, gw))
                            (d / "spillway.lua").write_text((EXAMPLES / "spillway.lua").read_text())
                        else:
                            (d / "haproxy.cfg").write_text(haproxy_alone(gw, upstream, limiter))
                        args_ = [binary("haproxy"), "-f", "haproxy.cfg"]
                    env_home = dict(os.environ, HOME=str(d))
                    g = subprocess.Popen(args_, cwd=d, stdout=open(d / "gw.log", "w"), stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, env=env_home)
                    procs.all.append(g)
                    wait_port(gw_port, name)
                    # Traefik loads its routes a moment after it binds.
                    end = time.time() + 20
                    while time.time() < end:
                        try:
                            c = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=2)
                            c.request("GET", "/ready", headers={"X-Api-Key": "ready"})
                            if c.getresponse().status != 404:
                                break
                        except OSError:
                            pass
                        time.sleep(0.1)
                    if phase == "bench":
                        url = f"http://{gw}/bench"
                        rps, p50, p99, bad = wrk(url, 32, args.seconds, str(script))
                        _, p50_1, p99_1, bad1 = wrk(url, 1, args.seconds, str(script))
                        row = [name, setup, f"{rps:,.0f}", f"{p50:,.0f} / {p99:,.0f}",
                               f"{p50_1:,.0f} / {p99_1:,.0f}", str(bad + bad1)]
                    else:
                        row.append(str(admitted_of(gw_port)))
                    procs.stop(g)
                    for p in own:
                        procs.stop(p)
                    if phase == "exact" or setup == "alone":
                        if setup == "alone":
                            row.append("no limit")
                        print("| " + " | ".join(row) + " |", flush=True)
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
