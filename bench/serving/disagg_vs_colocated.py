#!/usr/bin/env python3
"""Disaggregated against colocated serving on one machine, DistServe-style.

Both setups get the same two cores and run as separate processes on loopback:
  disaggregated  1 prefill worker pinned to core 0 and 1 decode worker pinned to core 1 (one
                 compute thread each), one cache-store shard, the router;
  colocated      2 decode workers in router.mode=colocated, one per core (one thread each): each
                 runs whole requests, chunked prefill mixed into its decode batches.
For each request rate, `tandem bench` sends the same Poisson workload (seeded) and reports TTFT,
TPOT, ITL and goodput under an SLO. Prints a table, writes JSON and a PNG plot.

  /usr/bin/python3 bench/serving/disagg_vs_colocated.py --build build --rates 4,8,12,16,20,24 \
      --out docs/figures/disagg_vs_colocated
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts", "train"))
import png  # noqa: E402  (the project's dependency-free PNG plotter)
from local_cluster import LocalCluster, bench  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--model", default="models/tandem-py-8l")
p.add_argument("--rates", default="4,8,12,16,20,24")
p.add_argument("--num-requests", type=int, default=100)
p.add_argument("--input-len", type=int, default=512)
p.add_argument("--output-len", type=int, default=128)
p.add_argument("--slo-ttft-ms", type=float, default=250)
p.add_argument("--slo-tpot-ms", type=float, default=10)
p.add_argument("--out", default="docs/figures/disagg_vs_colocated")
args = p.parse_args()
tandem = os.path.join(args.build, "tools", "tandem", "tandem")
logs = tempfile.mkdtemp(prefix="tandem_distserve_")


workload = {"num_requests": args.num_requests, "seed": 1, "input_len": args.input_len,
            "input_len_range": 0.5, "output_len": args.output_len, "output_len_range": 0.5,
            "slo_ttft_ms": args.slo_ttft_ms, "slo_tpot_ms": args.slo_tpot_ms}


def pick(report, *path):
    for k in path:
        report = report[k]
    return report


rates = [float(r) for r in args.rates.split(",")]
results = {}
cluster = LocalCluster(tandem, args.model, logs)
for mode in ("disaggregated", "colocated"):
    addr = cluster.up(mode)
    try:
        # page in weights, warm caches
        bench(tandem, addr, rates[0], workload, os.path.join(logs, "warmup.json"))
        results[mode] = [bench(tandem, addr, r, workload, os.path.join(logs, f"{mode}-{r}.json"))
                         for r in rates]
    finally:
        cluster.down()

os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
with open(args.out + ".json", "w") as f:
    json.dump({"args": vars(args), "rates": rates, "results": results}, f, indent=1)

keys = [("ttft_ms", "p99"), ("tpot_ms", "p99"), ("itl_ms", "p99")]
print(f"{'rate':>6} {'mode':<14} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} "
      f"{'TPOT p99':>9} {'ITL p99':>8} {'goodput':>8} {'tok/s':>7}")
for i, r in enumerate(rates):
    for mode in results:
        rep = results[mode][i]
        print(f"{r:>6g} {mode:<14} {pick(rep, 'ttft_ms', 'p50'):>9.1f} "
              f"{pick(rep, 'ttft_ms', 'p99'):>9.1f} {pick(rep, 'tpot_ms', 'p50'):>9.1f} "
              f"{pick(rep, 'tpot_ms', 'p99'):>9.1f} {pick(rep, 'itl_ms', 'p99'):>8.1f} "
              f"{rep.get('goodput', 0):>8.2f} {rep['output_throughput']:>7.0f}")

blue, red = (30, 70, 200), (200, 50, 40)
for name, path, label in (("tpot", ("tpot_ms", "p99"), "P99 TPOT (MS)"),
                          ("ttft", ("ttft_ms", "p99"), "P99 TTFT (MS)"),
                          ("goodput", ("goodput",), "GOODPUT (PER S)")):
    series = [(rates, [pick(rep, *path) for rep in results[m]], c, 3)
              for m, c in (("disaggregated", blue), ("colocated", red))]
    ys = [y for s in series for y in s[1]]
    png.line_plot(f"{args.out}_{name}.png", series,
                  f"{label}: BLUE DISAGGREGATED, RED COLOCATED", "ARRIVAL RATE (PER S)", label,
                  ylim=(0, max(ys) * 1.1 or 1))
print(f"wrote {args.out}.json and {args.out}_{{tpot,ttft,goodput}}.png")
