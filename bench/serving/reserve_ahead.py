#!/usr/bin/env python3
"""The prefill worker's store upload with and without `cache_store.reserve_ahead`.

Real processes on loopback, disaggregated as local_cluster.py starts them (prefill on core 0,
decode on core 1, one cache-store shard attached through shared memory, the router). Each round
brings the cluster up once per setting, in alternating order, and sends the same seeded
workload at a low rate (no queueing, so TTFT is one request's path). Reports per setting the
median over rounds of: the prefill worker's mean upload time per request
(tandem_kv_transfer_seconds{role="prefill"}: sum / count, scraped after the run), and TTFT p50
and p90 from `tandem bench`.

  /usr/bin/python3 bench/serving/reserve_ahead.py --build build --rounds 5 \
      [--baseline-build OLD/build]

--baseline-build adds the same cluster from another build (one from before the option existed:
its put was an Exists, a Reserve and a Commit), started without the option.
"""
import argparse
import os
import re
import statistics
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster, bench  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--model", default="models/tandem-py-8l")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--rate", type=float, default=4)
p.add_argument("--num-requests", type=int, default=60)
p.add_argument("--input-len", type=int, default=1024)  # 2 MiB of KV on the bundled model
p.add_argument("--output-len", type=int, default=8)
p.add_argument("--baseline-build", default="")
args = p.parse_args()
tandem = os.path.join(args.build, "tools", "tandem", "tandem")
logs = tempfile.mkdtemp(prefix="tandem_reserve_ahead_")
workload = {"num_requests": args.num_requests, "seed": 1, "input_len": args.input_len,
            "input_len_range": 0, "output_len": args.output_len, "output_len_range": 0}


def upload_seconds(url):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    total = count = 0.0
    for line in text.splitlines():
        m = re.match(r'tandem_kv_transfer_seconds_(sum|count)\{[^}]*role="prefill"[^}]*\} (\S+)',
                     line)
        if m:
            if m.group(1) == "sum":
                total += float(m.group(2))
            else:
                count += float(m.group(2))
    if count == 0:
        raise RuntimeError(f"no prefill uploads in {url}")
    return total / count, int(count)


settings = (["baseline"] if args.baseline_build else []) + ["false", "true"]
results = {s: [] for s in settings}
for r in range(args.rounds):
    order = settings[r % len(settings):] + settings[:r % len(settings)]  # rotated each round
    for setting in order:
        if setting == "baseline":
            binary = os.path.join(args.baseline_build, "tools", "tandem", "tandem")
            cluster = LocalCluster(binary, args.model, logs)
        else:
            cluster = LocalCluster(tandem, args.model, logs,
                                   ["--set", f"cache_store.reserve_ahead={setting}"])
        addr = cluster.up("disaggregated")
        try:
            bench(tandem, addr, args.rate, dict(workload, num_requests=8),
                  os.path.join(logs, "warmup.json"))
            before, n0 = upload_seconds(cluster.metrics["prefill"])
            rep = bench(tandem, addr, args.rate, workload,
                        os.path.join(logs, f"{setting}-{r}.json"))
            after, n1 = upload_seconds(cluster.metrics["prefill"])
            # the run's own mean: (sum after - sum before) / (count after - count before)
            mean = (after * n1 - before * n0) / (n1 - n0)
            results[setting].append((mean * 1e3, rep["ttft_ms"]["p50"], rep["ttft_ms"]["p90"],
                                     rep["completed"]))
        finally:
            cluster.down()

print(f"{args.rounds} rounds, {args.num_requests} requests of {args.input_len} prompt tokens at "
      f"{args.rate} req/s each; medians over rounds")
print("| cache_store.reserve_ahead | upload per request (ms) | TTFT p50 (ms) | TTFT p90 (ms) |")
print("|---|---|---|---|")
for setting in settings:
    rows = results[setting]
    med = [statistics.median(x[i] for x in rows) for i in range(3)]
    print(f"| {setting} | {med[0]:.2f} | {med[1]:.1f} | {med[2]:.1f} |")
    print("  per round:", "; ".join(f"{x[0]:.2f} ms, TTFT {x[1]:.1f}/{x[2]:.1f}" for x in rows),
          file=sys.stderr)
