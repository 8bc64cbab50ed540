#!/usr/bin/env python3
"""The planner's correction factors against real processes (issue #21, docs/planner.md,
"Correction factors"): `tandem bench` runs of a validate_planner.py workload on
local_cluster.py's deployment, each one's mean TTFT and TPOT then fitted on every given engine
profile (`tandem plan --rate R --live D --measured-ttft-ms --measured-tpot-ms`), beside the
factors the router itself fitted during the run (planner.profile = the first profile) and what
each profile recommends with and without them for the measured rate times --headroom.

A profile of this machine should fit factors near 1; a profile of another machine about this
machine's engine step times over that one's, which the script prints beside it from the two
profiles themselves (engine steps only: the serving stack's costs are not in that ratio).
Corrected, every profile should size the deployment alike.

  /usr/bin/python3 bench/serving/planner_correction.py --build build --workload mixed-avx2 \\
      --rate 0.5 --num-requests 60 --repeat 3 \\
      --profiles bench/profiles/125m-bf16-1t-zen3.json,bench/profiles/125m-bf16-1t.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import DEPLOYMENTS, WORKLOADS, LocalCluster, bench, counter, scrape  # noqa: E402

MAX_NUM_SEQS = 64  # scheduler.max_num_seqs' default, which the router plans with


def interpolate(points, x):
    """Piecewise linear through sorted (x, y) points, flat beyond the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def step_ratio(here, other, prompt, batch):
    """This machine's engine step times over the other profile's: prefill of a `prompt`-token
    prompt from scratch, and a decode step of `batch` sequences (the run's mean; a small batch
    reads the weights, memory-bound, a large one computes)."""
    def prefill(p):
        return sorted((s["tokens"], s["seconds"]) for s in p["prefill"] if s["context"] == 0)

    def decode(p):
        by_batch = {}
        for s in p["decode"]:
            by_batch.setdefault(s["batch"], []).append(s["seconds"])
        return sorted((b, min(v)) for b, v in by_batch.items())  # the shortest context's

    return (interpolate(prefill(here), prompt) / interpolate(prefill(other), prompt),
            interpolate(decode(here), batch) / interpolate(decode(other), batch))


def plan(args, profile, flags, slo, live=None, measured=None):
    """`tandem plan --rate` for the run's shape, on `profile` corrected to `measured`
    ((TTFT, TPOT) means in seconds on deployment `live`) when given."""
    cmd = [args.tandem, "plan", "--profile", profile, "--rate", str(args.rate), "--json",
           "--headroom", str(args.headroom),
           "--only", args.mode, "--max-num-seqs", str(MAX_NUM_SEQS), "--num-requests", "400",
           "--slo-ttft-ms", str(slo["slo_ttft_ms"]), "--slo-tpot-ms", str(slo["slo_tpot_ms"])]
    for key, value in flags.items():
        cmd += ["--" + key.replace("_", "-"), str(value)]
    if measured:
        cmd += ["--live", live, "--measured-ttft-ms", str(measured[0] * 1e3),
                "--measured-tpot-ms", str(measured[1] * 1e3)]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)[0]
    return {"recommended": [out["prefill_replicas"], out["decode_replicas"]],
            "correction": out.get("correction")}


def measure(args, workload, model, slo, profile):
    """One bench run with the router planning on `profile`; the measured means and the
    router's own fit."""
    logs = tempfile.mkdtemp(prefix="planner_correction_")
    cluster = LocalCluster(args.tandem, model, logs)
    router_set = [
        f"planner.profile={profile}", f"planner.slo_ttft_ms={slo['slo_ttft_ms']}",
        f"planner.slo_tpot_ms={slo['slo_tpot_ms']}", "planner.interval_seconds=1",
        "planner.window_seconds=3600", f"planner.min_requests={args.num_requests}",
        "planner.correction_smoothing=1", "planner.shared_stack_cpu=true"]
    try:
        addr = cluster.up(args.mode, router_extra=sum((["--set", s] for s in router_set), []))
        out = os.path.join(logs, "bench.json")
        report = bench(args.tandem, addr, args.rate, dict(workload, num_requests=args.num_requests),
                       out)
        # The router's first round with every request in its window (planner.min_requests)
        # moves the factors off 1; a poll with a deadline, as nothing signals it.
        deadline = time.monotonic() + 60
        while True:
            samples = scrape(cluster.metrics["router"])
            factors = [counter(samples, "tandem_planner_correction_factor", {"phase": p})
                       for p in ("prefill", "decode")]
            if factors != [1.0, 1.0] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        decode = scrape(cluster.metrics["decode"])
        batch = (counter(decode, "tandem_engine_step_sequences_total", {}) /
                 max(1.0, counter(decode, "tandem_engine_steps_total", {})))
    finally:
        cluster.down()
    return {"ttft_mean_s": report["ttft_ms"]["mean"] / 1e3,
            "tpot_mean_s": report["tpot_ms"]["mean"] / 1e3,
            "ttft_p90_s": report["ttft_ms"]["p90"] / 1e3,
            "router_factors": factors, "mean_decode_batch": batch}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--workload", default="mixed-avx2", choices=sorted(WORKLOADS))
    p.add_argument("--mode", default="disaggregated", choices=sorted(DEPLOYMENTS))
    p.add_argument("--rate", type=float, default=0.5)
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--headroom", type=float, default=1.25,
                   help="size for the measured rate times this (planner.headroom); the factors "
                        "are fitted at the measured rate")
    p.add_argument("--profiles", default="bench/profiles/125m-bf16-1t-zen3.json,"
                                         "bench/profiles/125m-bf16-1t.json",
                   help="the first is this machine's: the others' step ratios are against it, "
                        "and the router plans on it")
    p.add_argument("--json-out", default="")
    args = p.parse_args()
    args.tandem = os.path.join(args.build, "tools/tandem/tandem")
    model, _, _, flags = WORKLOADS[args.workload]
    flags = dict(flags)
    slo = {k: flags.pop(k) for k in ("slo_ttft_ms", "slo_tpot_ms")}
    live = DEPLOYMENTS[args.mode]
    profiles = args.profiles.split(",")
    loaded = []
    for path in profiles:
        with open(path) as f:
            loaded.append(json.load(f))
    plain = [plan(args, path, flags, slo) for path in profiles]
    runs = []
    for i in range(args.repeat):
        m = measure(args, flags, model, slo, profiles[0])
        ratios = [step_ratio(loaded[0], p, flags.get("input_len", 512), m["mean_decode_batch"])
                  for p in loaded]
        m["step_ratios"] = ratios
        m["fits"] = [plan(args, path, flags, slo, live, (m["ttft_mean_s"], m["tpot_mean_s"]))
                     for path in profiles]
        runs.append(m)
        print(f"run {i + 1}: measured TTFT mean {m['ttft_mean_s'] * 1e3:.0f} ms (p90 "
              f"{m['ttft_p90_s'] * 1e3:.0f}), TPOT mean {m['tpot_mean_s'] * 1e3:.1f} ms, mean "
              f"decode batch {m['mean_decode_batch']:.2f}; router's "
              f"factors {m['router_factors'][0]:.3f} / {m['router_factors'][1]:.3f}", flush=True)
        for path, ratio, fit, unfit in zip(profiles, ratios, m["fits"], plain):
            c = fit["correction"]
            print(f"  {os.path.basename(path)}: factors prefill {c['prefill']:.3f} decode "
                  f"{c['decode']:.3f} (engine steps here / profile's {ratio[0]:.3f}, "
                  f"{ratio[1]:.3f}); recommends {fit['recommended']} corrected, "
                  f"{unfit['recommended']} as profiled", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "as_profiled": plain,
                       "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
