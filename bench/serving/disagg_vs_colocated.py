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
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts", "train"))
import png  # noqa: E402  (the project's dependency-free PNG plotter)

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


def start(role, cores, extra):
    log = open(os.path.join(logs, f"{role}-{len(procs)}.log"), "w")
    cmd = (["taskset", "-c", cores] if cores else []) + [
        tandem, role, "--model", args.model, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
        "--set", "model.threads=1"] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    m = re.search(r"serving on ([^;\s]+)", line)
    if not m:
        raise RuntimeError(f"{role} did not start: {line!r}")
    procs.append(proc)
    return m.group(1)


def stop_all():
    for proc in reversed(procs):
        proc.terminate()
        proc.wait()
    procs.clear()


def cluster(mode):
    if mode == "disaggregated":
        shard = start("cache-store", None, [])
        store = ["--set", f"cache_store.shards=[{shard}]"]
        prefill = start("prefill", "0", store)
        decode = start("decode", "1", store)
        return start("router", None, ["--set", f"router.prefill_workers=[{prefill}]",
                                      "--set", f"router.decode_workers=[{decode}]"])
    decodes = [start("decode", str(core), []) for core in (0, 1)]
    return start("router", None, ["--set", "router.mode=colocated",
                                  "--set", f"router.decode_workers=[{','.join(decodes)}]"])


def bench(addr, rate, out_json):
    subprocess.run([tandem, "bench", "--addr", addr, "--num-requests", str(args.num_requests),
                    "--request-rate", str(rate), "--seed", "1",
                    "--input-len", str(args.input_len), "--input-len-range", "0.5",
                    "--output-len", str(args.output_len), "--output-len-range", "0.5",
                    "--slo-ttft-ms", str(args.slo_ttft_ms), "--slo-tpot-ms", str(args.slo_tpot_ms),
                    "--json-out", out_json, "--progress=false"],
                   check=True, stdout=subprocess.DEVNULL)
    with open(out_json) as f:
        return json.load(f)


def pick(report, *path):
    for k in path:
        report = report[k]
    return report


procs = []
rates = [float(r) for r in args.rates.split(",")]
results = {}
for mode in ("disaggregated", "colocated"):
    addr = cluster(mode)
    try:
        bench(addr, rates[0], os.path.join(logs, "warmup.json"))  # page in weights, warm caches
        results[mode] = [bench(addr, r, os.path.join(logs, f"{mode}-{r}.json")) for r in rates]
    finally:
        stop_all()

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
