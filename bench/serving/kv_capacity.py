#!/usr/bin/env python3
"""How many sequences run at once at the same KV budget, per KV dtype, measured with `tandem bench`.

For each --dtypes entry (a KV dtype, optionally with more settings: `fp16:kv_cache.eviction.
budget_tokens=512`), starts one decode worker (router.mode=colocated: it runs whole requests)
with kv_cache.memory_bytes = --memory, and a router; sends --num-requests requests all at once
(prompt --input-len, --output-len generated tokens each); while they run, reads the worker's
/metrics every 0.1 s. Sequences beyond what the cache holds wait (or are preempted), so the
number running is what the cache can hold. Prints, per dtype: the most sequences running at once,
the mean while requests were still waiting (the cache full), the bench's duration and output
throughput; and each dtype's ratio to the first one.

  /usr/bin/python3 bench/serving/kv_capacity.py --build build --dtypes fp16,mixed,int8 \\
      --memory 96MiB --input-len 1800 --output-len 128 --num-requests 80
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--model", default="models/tandem-py-8l")
p.add_argument("--dtypes", default="fp16,mixed")
p.add_argument("--memory", default="96MiB")
p.add_argument("--max-num-seqs", type=int, default=128)
p.add_argument("--window-tokens", type=int, default=64)
p.add_argument("--input-len", type=int, default=1800)
p.add_argument("--output-len", type=int, default=128)
p.add_argument("--num-requests", type=int, default=80)
p.add_argument("--extra", action="append", default=[],
               help="more --set key=value for the worker (repeatable)")
args = p.parse_args()
tandem = os.path.join(args.build, "tools", "tandem", "tandem")
logs = tempfile.mkdtemp(prefix="tandem_kv_capacity_")


def start(role, extra, procs):
    log = open(os.path.join(logs, f"{role}-{len(procs)}.log"), "w")
    cmd = [tandem, role, "--model", args.model, "--listen", "127.0.0.1:0",
           "--metrics-listen", "127.0.0.1:0"] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    m = re.search(r"serving on ([^;\s]+); metrics (\S+)", line)
    if not m:
        raise RuntimeError(f"{role} did not start: {line!r}")
    procs.append(proc)
    return m.group(1), m.group(2)


def gauge(url, name):
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(r"^" + name + r"\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def measure(entry):
    procs = []
    dtype, *settings = entry.split(":")
    worker = ["--set", f"kv_cache.dtype={dtype}", "--set", f"kv_cache.memory_bytes={args.memory}",
              "--set", f"scheduler.max_num_seqs={args.max_num_seqs}",
              "--set", f"kv_cache.mixed.window_tokens={args.window_tokens}"]
    for kv in args.extra + settings:
        worker += ["--set", kv]
    try:
        decode, metrics = start("decode", worker, procs)
        url = metrics if metrics.startswith("http") else f"http://{metrics}/metrics"
        router, _ = start("router", ["--set", "router.mode=colocated",
                                     "--set", f"router.decode_workers=[{decode}]"], procs)
        samples, stop = [], threading.Event()

        def poll():
            while not stop.is_set():
                samples.append((gauge(url, "tandem_requests_running"),
                                gauge(url, "tandem_requests_waiting")))
                time.sleep(0.1)
        poller = threading.Thread(target=poll)
        poller.start()
        out = os.path.join(logs, f"{len(os.listdir(logs))}.json")
        t0 = time.monotonic()
        subprocess.run([tandem, "bench", "--addr", router, "--num-requests",
                        str(args.num_requests), "--request-rate", "inf", "--seed", "1",
                        "--input-len", str(args.input_len), "--output-len", str(args.output_len),
                        "--json-out", out, "--progress=false"], check=True,
                       stdout=subprocess.DEVNULL)
        seconds = time.monotonic() - t0
        stop.set()
        poller.join()
        with open(out) as f:
            report = json.load(f)
        full = [r for r, w in samples if w > 0]
        return {"max_running": max(r for r, _ in samples), "mean_running_while_waiting":
                statistics.mean(full) if full else 0.0, "seconds": seconds,
                "output_throughput": report["output_throughput"],
                "completed": report.get("completed", args.num_requests)}
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait()


results = {d: measure(d) for d in args.dtypes.split(",")}
base = next(iter(results.values()))
print(f"KV budget {args.memory}, {args.num_requests} requests at once of {args.input_len} prompt "
      f"+ {args.output_len} generated tokens, max_num_seqs {args.max_num_seqs}, "
      f"mixed window {args.window_tokens}")
print(f"{'dtype':<44} {'max running':>11} {'ratio':>6} {'mean running (cache full)':>26} "
      f"{'ratio':>6} {'seconds':>8} {'tok/s':>7} {'ratio':>6}")
for d, r in results.items():
    ratio = r["mean_running_while_waiting"] / max(base["mean_running_while_waiting"], 1e-9)
    print(f"{d:<44} {r['max_running']:>11.0f} {r['max_running'] / base['max_running']:>6.2f} "
          f"{r['mean_running_while_waiting']:>26.1f} {ratio:>6.2f} {r['seconds']:>8.1f} "
          f"{r['output_throughput']:>7.0f} "
          f"{r['output_throughput'] / base['output_throughput']:>6.2f}")
