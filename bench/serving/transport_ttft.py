#!/usr/bin/env python3
"""TTFT through each way KV bytes move (cache_store.transport): grpc, shm, ucx over TCP and ucx
over shared memory (UCX_TLS), every role its own process on loopback, disaggregated as
local_cluster.py starts them (prefill on core 0, decode on core 1, one cache-store shard, the
router). Each round brings the cluster up once per transport, in rotated order, and sends the
same seeded workload at a low rate (no queueing, so TTFT is one request's path: prefill, the
put, the decode's get, its first step). Reports per transport the median over rounds of TTFT
p50 and p90 from `tandem bench`, and of the mean put and get times per request the workers
report (tandem_kv_transport_seconds, by transport), checking that the transport carried them.

  /usr/bin/python3 bench/serving/transport_ttft.py --build build --rounds 3 \
      [--model /tmp/m125 --input-len 2048] [--preallocate]
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster, bench, histogram, scrape  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--model", default="models/tandem-py-8l")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--rate", type=float, default=2)
p.add_argument("--num-requests", type=int, default=20)
p.add_argument("--input-len", type=int, default=2000)  # the bundled model holds 2,048 positions
p.add_argument("--output-len", type=int, default=4)
p.add_argument("--preallocate", action="store_true",
               help="cache_store.preallocate=true: no put or get faults arena pages in")
args = p.parse_args()
tandem = os.path.join(args.build, "tools", "tandem", "tandem")
logs = tempfile.mkdtemp(prefix="tandem_transport_ttft_")
workload = {"num_requests": args.num_requests, "seed": 1, "input_len": args.input_len,
            "input_len_range": 0, "output_len": args.output_len, "output_len_range": 0}
# name: (cache_store.transport, UCX_TLS, the transport label its transfers carry)
SETTINGS = {"grpc": ("grpc", None, "grpc"), "shm": ("shm", None, "shm"),
            "ucx tcp": ("ucx", "tcp,self", "ucx"), "ucx sm": ("ucx", "sm,self", "ucx")}


def mean_ms(url, role, direction, transport):
    h = histogram(scrape(url), "tandem_kv_transport_seconds",
                  {"role": role, "direction": direction, "transport": transport})
    if not h["count"]:
        raise RuntimeError(f"no {direction} over {transport} at {url}")
    return h["sum"] / h["count"] * 1e3, h["count"]


results = {s: [] for s in SETTINGS}
names = list(SETTINGS)
for r in range(args.rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
        transport, tls, label = SETTINGS[name]
        if tls:
            os.environ["UCX_TLS"] = tls
        else:
            os.environ.pop("UCX_TLS", None)
        cluster = LocalCluster(tandem, args.model, logs,
                               ["--set", f"cache_store.transport={transport}",
                                "--set", f"cache_store.preallocate={str(args.preallocate).lower()}"])
        addr = cluster.up("disaggregated")
        try:
            bench(tandem, addr, args.rate, dict(workload, num_requests=4, seed=2),
                  os.path.join(logs, "warmup.json"))
            put0, n_put0 = mean_ms(cluster.metrics["prefill"], "prefill", "put", label)
            get0, n_get0 = mean_ms(cluster.metrics["decode"], "decode", "get", label)
            rep = bench(tandem, addr, args.rate, workload,
                        os.path.join(logs, f"{name.replace(' ', '-')}-{r}.json"))
            put1, n_put1 = mean_ms(cluster.metrics["prefill"], "prefill", "put", label)
            get1, n_get1 = mean_ms(cluster.metrics["decode"], "decode", "get", label)
            put = (put1 * n_put1 - put0 * n_put0) / max(n_put1 - n_put0, 1)
            get = (get1 * n_get1 - get0 * n_get0) / max(n_get1 - n_get0, 1)
            results[name].append((rep["ttft_ms"]["p50"], rep["ttft_ms"]["p90"], put, get,
                                  rep["completed"]))
        finally:
            cluster.down()
os.environ.pop("UCX_TLS", None)

print(f"{args.rounds} rounds, {args.num_requests} requests of {args.input_len} prompt tokens, "
      f"{args.output_len} output tokens, at {args.rate} req/s"
      f"{', arenas preallocated' if args.preallocate else ''}; medians over rounds")
print("| transport | TTFT p50 (ms) | TTFT p90 (ms) | put per request (ms) | get per request (ms) |")
print("|---|---|---|---|---|")
for name in SETTINGS:
    rows = results[name]
    med = [statistics.median(x[i] for x in rows) for i in range(4)]
    print(f"| {name} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.2f} | {med[3]:.2f} |")
    print(f"  {name} per round:", "; ".join(
        f"TTFT {x[0]:.1f}/{x[1]:.1f}, put {x[2]:.2f}, get {x[3]:.2f}, {x[4]} done" for x in rows),
        file=sys.stderr)
