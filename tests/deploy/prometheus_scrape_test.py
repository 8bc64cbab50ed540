#!/usr/bin/env python3
"""A real Prometheus scrapes `tandem serve` under load; every dashboard query and alert
expression of deploy/ must return data through Prometheus's HTTP API.

Starts `tandem serve` on loopback (POP pruning with its attention-stability monitor on, so the
pruning panels have data, and a disk tier behind the store shard, for the tier panels), starts Debian's `prometheus` with deploy/prometheus/alerts.yaml and a
1 s scrape/evaluation interval, drives load with `tandem bench`, then queries:
  - every `expr` of deploy/grafana/tandem.json (Grafana variables substituted),
  - every alert's `tandem_query` annotation (its expression without the final threshold),
  - every recording rule's name,
and checks the target is up and every rule evaluates without error.
Exit 77 (skipped) when the prometheus binary is missing.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SKIP = 77
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Grafana variables the dashboard may use, as this test substitutes them.
GRAFANA_VARS = {"$__rate_interval": "1m", "${__rate_interval}": "1m", "$__interval": "15s",
                "${__interval}": "15s", "$__range": "5m", "${__range}": "5m"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def http_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def dashboard_queries(path):
    """(panel title, expr) of every target of every panel, rows' nested panels included."""
    out = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p.get("title", "?"), t["expr"]))

    with open(path) as f:
        walk(json.load(f).get("panels", []))
    return out


def substitute(expr, variables):
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace(name, variables[name])
    left = re.findall(r"\$\{?\w+\}?", expr)
    if left:
        raise ValueError(f"unsubstituted Grafana variables {left} in: {expr}")
    return expr


def dashboard_variables(path):
    """The dashboard's own template variables, each as a regex matching every value ('.*')."""
    with open(path) as f:
        dash = json.load(f)
    variables = dict(GRAFANA_VARS)
    for v in dash.get("templating", {}).get("list", []):
        name = v.get("name")
        if name and v.get("type") != "datasource":
            variables[f"${name}"] = variables[f"${{{name}}}"] = ".*"
    return variables


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--model", default=os.path.join(REPO, "models/tandem-py-8l"))
    ap.add_argument("--prometheus", default=shutil.which("prometheus"))
    ap.add_argument("--load-seconds", type=float, default=25)
    args = ap.parse_args()
    if not args.prometheus:
        print("skipped: no prometheus binary (Debian package prometheus)")
        return SKIP
    dashboard = os.path.join(REPO, "deploy/grafana/tandem.json")
    alerts = os.path.join(REPO, "deploy/prometheus/alerts.yaml")

    work = tempfile.mkdtemp(prefix="tandem_prom_")
    procs = []

    def start(cmd, log_name):
        log = open(os.path.join(work, log_name), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append((p, log_name))
        return p

    def log_text(name):
        with open(os.path.join(work, name)) as f:
            return f.read()

    failures = []
    try:
        # Tandem, every role in one process, with pruning and its stability monitor on.
        serve = start([args.tandem, "serve", "--model", args.model, "--listen", "127.0.0.1:0",
                       "--metrics-listen", "127.0.0.1:0",
                       "--set", "kv_cache.memory_bytes=64MiB",
                       "--set", "kv_cache_optimization.enabled=true",
                       "--set", "kv_cache_optimization.pruning.ratio=0.25",
                       "--set", "kv_cache_optimization.min_batch_size=1",
                       "--set", "kv_cache_optimization.monitor.sample_rate=1",
                       # A disk tier behind the store shard, for the tier panels.
                       "--set", f"cache_store.disk.directory={os.path.join(work, 'kv-disk')}",
                       "--set", "cache_store.disk.capacity_bytes=64MiB",
                       "--set", "cache_store.disk.segment_bytes=8MiB"], "serve.log")
        first = wait_for(lambda: serve.poll() is None and "router on" in log_text("serve.log")
                         and log_text("serve.log"), 60, "tandem serve to start")
        if serve.poll() is not None:
            raise RuntimeError("tandem serve exited:\n" + first)
        router = re.search(r"router on ([^;]+);", first).group(1)
        metrics = re.search(r"http://([^/]+)/metrics", first).group(1)

        # Prometheus scraping it every second, evaluating the alert and recording rules.
        port = free_port()
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {alerts}
scrape_configs:
  - job_name: tandem
    static_configs:
      - targets: ["{metrics}"]
""")
        start([args.prometheus, f"--config.file={config}",
               f"--storage.tsdb.path={os.path.join(work, 'data')}",
               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], "prometheus.log")
        api = f"http://127.0.0.1:{port}/api/v1"

        def ready():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(ready, 60, "prometheus to be ready")

        def target_up():
            targets = http_json(f"{api}/targets")["data"]["activeTargets"]
            return targets and all(t["health"] == "up" for t in targets)

        wait_for(target_up, 30, "prometheus to scrape tandem")

        # Load: prompts long enough for whole KV blocks (decode-side lookups), over several
        # scrapes, so rate() and histogram_quantile() have two or more samples in their windows.
        rate = 4
        bench = subprocess.run(
            [args.tandem, "bench", "--addr", router,
             "--num-requests", str(int(args.load_seconds * rate)), "--request-rate", str(rate),
             "--input-len", "160", "--input-len-range", "0.5", "--output-len", "24",
             "--seed", "3"], capture_output=True, text=True, timeout=args.load_seconds * 6 + 120)
        print(bench.stdout[-1500:])
        if bench.returncode != 0:
            raise RuntimeError(f"tandem bench failed:\n{bench.stdout}\n{bench.stderr}")

        def query(expr):
            url = f"{api}/query?" + urllib.parse.urlencode({"query": expr})
            try:
                body = http_json(url)
            except urllib.error.HTTPError as e:
                return None, e.read().decode(errors="replace")
            return body["data"]["result"], None

        variables = dashboard_variables(dashboard)
        panels = dashboard_queries(dashboard)

        def check():
            """Failures of every dashboard query and rule, with the rule counts."""
            found = []
            for title, expr in panels:
                q = substitute(expr, variables)
                result, error = query(q)
                if error or not result:
                    found.append(f"dashboard panel '{title}': {q} -> {error or 'no data'}")
            # Every rule Prometheus loaded: healthy, and with data.
            groups = http_json(f"{api}/rules")["data"]["groups"]
            alert_rules = [r for g in groups for r in g["rules"] if r["type"] == "alerting"]
            records = [r for g in groups for r in g["rules"] if r["type"] == "recording"]
            if not alert_rules:
                found.append(f"prometheus loaded no alert rules from {alerts}")
            for r in alert_rules + records:
                if r.get("health") != "ok":
                    found.append(f"rule {r['name']}: health {r.get('health')}: "
                                 f"{r.get('lastError')}")
            for r in alert_rules:
                data_query = r.get("annotations", {}).get("tandem_query")
                if not data_query:
                    found.append(f"alert {r['name']} has no tandem_query annotation")
                    continue
                result, error = query(data_query)
                if error or not result:
                    found.append(f"alert {r['name']}: {data_query} -> {error or 'no data'}")
            for r in records:
                result, error = query(r["name"])
                if error or not result:
                    found.append(f"recording rule {r['name']}: {error or 'no data'}")
            return found, len(alert_rules), len(records)

        # Rules evaluate every second after the scrapes that saw the load: poll until every
        # query has data, for at most 30 s (well inside the dashboards' 1 m rate windows).
        deadline = time.time() + 30
        while True:
            failures, num_alerts, num_records = check()
            if not failures or time.time() > deadline:
                break
            time.sleep(1)
        print(f"prometheus scrape: {len(panels)} dashboard queries, {num_alerts} alerts, "
              f"{num_records} recording rules checked, {len(failures)} failure(s)")
    finally:
        for p, _ in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p, name in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if failures:
            for name in ("serve.log", "prometheus.log"):
                print(f"--- {name} (last lines)")
                print("\n".join(log_text(name).splitlines()[-20:]))
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
