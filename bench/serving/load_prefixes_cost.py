#!/usr/bin/env python3
"""What `cache_store.load_prefixes` costs when nothing is found (issue #22): the time to first
token of prompts no worker ever stored, with the prefill workers' store lookup off and on, on
local_cluster.py's disaggregated deployment. Every prompt is random, so each lookup misses
(the prefill workers' tandem_kv_lookups_total{role="prefill"} says so); the difference is the
lookup's cost on the critical path. The two settings alternate, each on a fresh cluster with
the same requests, `--rounds` times; medians over the rounds. With the lookup on, the prefill
worker's tandem_prefix_lookup_seconds measures the added time per prompt directly (the fetch
queue, the engine probe, the store Get and the import), which host noise in the TTFT
comparison hides.

  /usr/bin/python3 bench/serving/load_prefixes_cost.py --build build --workload decode-heavy \\
      --rate 2 --num-requests 100 --rounds 3
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import (WORKLOADS, LocalCluster, bench, counter, histogram,  # noqa: E402
                           histogram_delta, histogram_quantile, scrape)


def run(args, model, flags, load):
    logs = tempfile.mkdtemp(prefix="load_prefixes_")
    cluster = LocalCluster(args.tandem, model, logs,
                           ["--set", f"cache_store.load_prefixes={'true' if load else 'false'}"])
    try:
        addr = cluster.up("disaggregated")
        bench(args.tandem, addr, 4, dict(flags, num_requests=10, seed=1000),
              os.path.join(logs, "warmup.json"))
        before = scrape(cluster.metrics["prefill"])
        report = bench(args.tandem, addr, args.rate,
                       dict(flags, num_requests=args.num_requests, seed=1),
                       os.path.join(logs, "bench.json"))
        after = scrape(cluster.metrics["prefill"])
    finally:
        cluster.down()
    lookups = {r: counter(after, "tandem_kv_lookups_total", {"role": "prefill", "result": r}) -
              counter(before, "tandem_kv_lookups_total", {"role": "prefill", "result": r})
              for r in ("hit", "miss")}
    lookup = histogram_delta(histogram(before, "tandem_prefix_lookup_seconds", {}),
                             histogram(after, "tandem_prefix_lookup_seconds", {}))
    return {"ttft_p50_ms": report["ttft_ms"]["p50"], "ttft_mean_ms": report["ttft_ms"]["mean"],
            "ttft_p90_ms": report["ttft_ms"]["p90"], "lookups": lookups,
            "lookup_mean_ms": 1e3 * lookup["sum"] / lookup["count"] if lookup["count"] else None,
            "lookup_p90_le_ms": 1e3 * histogram_quantile(lookup, 0.9) if lookup["count"] else None}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--workload", default="decode-heavy", choices=sorted(WORKLOADS))
    p.add_argument("--rate", type=float, default=2)
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    args.tandem = os.path.join(args.build, "tools/tandem/tandem")
    model, _, _, flags = WORKLOADS[args.workload]
    flags = {k: v for k, v in flags.items() if not k.startswith("slo_")}
    rows = {False: [], True: []}
    for i in range(args.rounds):
        for load in (False, True):
            r = run(args, model, flags, load)
            rows[load].append(r)
            print(f"round {i + 1} load_prefixes={'on ' if load else 'off'}: TTFT p50 "
                  f"{r['ttft_p50_ms']:.1f} ms, mean {r['ttft_mean_ms']:.1f}, p90 "
                  f"{r['ttft_p90_ms']:.1f}; prefill lookups {r['lookups']}"
                  + (f"; lookup time mean {r['lookup_mean_ms']:.2f} ms, p90 <= "
                     f"{r['lookup_p90_le_ms']:.1f} ms" if r["lookup_mean_ms"] is not None else ""),
                  flush=True)
    for key in ("ttft_p50_ms", "ttft_mean_ms", "ttft_p90_ms"):
        off = statistics.median(r[key] for r in rows[False])
        on = statistics.median(r[key] for r in rows[True])
        diffs = [b[key] - a[key] for a, b in zip(rows[False], rows[True])]
        print(f"{key}: off {off:.1f}, on {on:.1f} (median of the rounds); on - off per round: "
              + ", ".join(f"{d:+.1f}" for d in diffs))


if __name__ == "__main__":
    main()
