#!/usr/bin/env python3
"""Where the two cores go in a serving run (issue #21): per process, its CPU time and the time
its threads waited, runnable, for a core (the kernel's schedstat run delay), over one `tandem
bench` run of a validate_planner.py workload on local_cluster.py's deployments.

Columns: the share of the run's wall time each process was on a core (100% = one core),
its CPU time per request of the run (all requests, not only those it served), and the share of
the wall time its threads waited for a core. A pinned worker's busiest thread is its engine
loop; its run delay is how long others held its core while it had work. The unpinned
processes (router, store shard, the bench client) are what the engine profile does not see.

  /usr/bin/python3 bench/serving/cpu_share.py --build build --workload decode-heavy \\
      --modes disaggregated,colocated --rates 4,16,24 --profile bench/profiles/tandem-py-8l-1t.json

With --profile (a file, or 'workload' for the workload's own), each point is also simulated
(`tandem plan --deployment ... --rates R`, the same requests, --stream-interval as --set
gives it) and the simulated TTFT/TPOT and the replicas' busy seconds are printed beside the
measured ones. --set overrides config for every role, e.g. --set scheduler.stream_interval=4.
Disaggregated points also print the serving stack's CPU per streamed message (the decode
worker's outside its steps and tasks, and the router's): the profile's
token_overhead_seconds, which --token-overhead-us sets for the simulation.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import (DEPLOYMENTS, ITL, WORKLOADS, LocalCluster, delta,  # noqa: E402
                           engine_loop, histogram, histogram_delta, histogram_quantile,
                           scrape_roles, threads)


def itl_by_role(samples):
    """The inter-token histograms where tokens are made (the decode engine) and relayed (the
    router)."""
    return {role: histogram(samples[role], ITL, {"role": role}) for role in ("decode", "router")}


def flags_of(workload):
    flags = []
    for key, value in workload.items():
        flags += ["--" + key.replace("_", "-"), str(value)]
    return flags


p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--workload", default="decode-heavy", choices=sorted(WORKLOADS))
p.add_argument("--modes", default="disaggregated,colocated")
p.add_argument("--rates", default="4,16,24")
p.add_argument("--num-requests", type=int, default=100)
p.add_argument("--json-out", default="")
p.add_argument("--profile", default="",
               help="also simulate each point; 'workload' takes the workload's own profile")
p.add_argument("--token-overhead-us", type=float, default=None,
               help="with --profile: the serving stack's CPU per streamed message to simulate "
                    "with (default: the profile's token_overhead_seconds)")
p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
               help="a config override for every role (repeatable), e.g. scheduler.stream_interval=4")
args = p.parse_args()
tandem = os.path.join(args.build, "tools", "tandem", "tandem")
logs = tempfile.mkdtemp(prefix="tandem_cpu_share_")
model, profile, _, flags = WORKLOADS[args.workload]
if args.profile == "workload":
    args.profile = profile
results = []
STREAM_INTERVAL = int(next((kv.split("=", 1)[1] for kv in args.set
                            if kv.startswith("scheduler.stream_interval=")), 1))


def simulate(mode, rate, seed):
    """The simulator's row for the point: busy_seconds, ttft/tpot percentiles."""
    out = subprocess.run([tandem, "plan", "--profile", args.profile, "--deployment",
                          DEPLOYMENTS[mode], "--rates", rate, "--max-num-seqs", "64", "--json",
                          "--num-requests", str(args.num_requests), "--seed", str(seed),
                          "--stream-interval", str(STREAM_INTERVAL)]
                         + (["--token-overhead-us", str(args.token_overhead_us)]
                            if args.token_overhead_us is not None else [])
                         + flags_of(flags), check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]


def per_message_us(row, measured):
    """The serving stack's CPU per streamed message (disaggregated): the decode worker's CPU
    outside its steps and tasks, and the router's, over the messages the decode worker sent
    (each request's first, then one per stream_interval tokens)."""
    e = row["engine_loop"]["decode"]
    decode = next(v for k, v in row["processes"].items() if k.startswith("decode"))
    router = next(v for k, v in row["processes"].items() if k.startswith("router"))
    outside = (decode["cpu"] - e["step_cpu_ms"] * e["steps"] / 1e3
               - e["tasks_share"] * row["wall_seconds"])
    n = measured["completed"]
    messages = n + max(0, measured["total_output_tokens"] - 2 * n) / STREAM_INTERVAL
    return 1e6 * outside / messages, 1e6 * router["cpu"] / messages


for mode in args.modes.split(","):
    cluster = LocalCluster(tandem, model, logs, [f for kv in args.set for f in ("--set", kv)])
    addr = cluster.up(mode)
    roles = {}
    for proc in cluster.procs:
        cmd = proc.args
        role = cmd[cmd.index(tandem) + 1]
        pinned = cmd[2] if cmd[0] == "taskset" else "-"
        roles[proc.pid] = f"{role}@{pinned}"
    try:
        subprocess.run([tandem, "bench", "--addr", addr, "--request-rate", "4",
                        "--progress=false", "--num-requests", "10", "--seed", "1000"]
                       + flags_of(flags), check=True, stdout=subprocess.DEVNULL)
        for i, rate in enumerate(args.rates.split(",")):
            out_json = os.path.join(logs, f"{mode}-{rate}.json")
            before = {pid: threads(pid) for pid in roles}
            scraped_before = scrape_roles(cluster)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.monotonic()
            subprocess.run([tandem, "bench", "--addr", addr, "--request-rate", rate,
                            "--progress=false", "--json-out", out_json, "--num-requests",
                            str(args.num_requests), "--seed", str(i + 1)] + flags_of(flags),
                           check=True, stdout=subprocess.DEVNULL)
            wall = time.monotonic() - start
            scraped_after = scrape_roles(cluster)
            itl_before, itl_after = itl_by_role(scraped_before), itl_by_role(scraped_after)
            after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
            with open(out_json) as f:
                measured = json.load(f)
            row = {"mode": mode, "rate": float(rate), "wall_seconds": wall,
                   "ttft_p90_ms": measured["ttft_ms"]["p90"],
                   "tpot_p50_ms": measured["tpot_ms"]["p50"],
                   "tpot_p90_ms": measured["tpot_ms"]["p90"], "processes": {}, "itl": {}}
            for role in itl_after:
                h = histogram_delta(itl_before[role], itl_after[role])
                row["itl"][role] = {"mean_ms": 1e3 * h["sum"] / max(h["count"], 1),
                                    "p90_le_ms": 1e3 * histogram_quantile(h, 0.9)}
            row["engine_loop"] = {role: engine_loop(scraped_before, scraped_after, role, wall)
                                  for role in ("prefill", "decode") if role in scraped_after}
            bench_cpu = (after_children.ru_utime + after_children.ru_stime
                         - children.ru_utime - children.ru_stime)
            row["processes"]["bench@-"] = {"cpu": bench_cpu, "delay": None, "busiest": None}
            for pid, name in roles.items():
                d = delta(before[pid], threads(pid))
                busiest = max(d.items(), key=lambda kv: kv[1][0])
                row["processes"][name] = {
                    "cpu": sum(v[0] for v in d.values()),
                    "delay": sum(v[1] for v in d.values()),
                    "busiest": {"cpu": busiest[1][0], "delay": busiest[1][1]}}
            if args.profile:
                sim = simulate(mode, rate, i + 1)
                row["simulated_busy_seconds"] = sim["busy_seconds"]
                row["simulated"] = {"ttft_p90_ms": sim["ttft_seconds"]["p90"] * 1e3,
                                    "tpot_p50_ms": sim["tpot_seconds"]["p50"] * 1e3,
                                    "tpot_p90_ms": sim["tpot_seconds"]["p90"] * 1e3}
            if mode == "disaggregated":
                row["per_message_us"] = dict(zip(("decode", "router"),
                                                 per_message_us(row, measured)))
            results.append(row)
            print(f"\n{mode} at {rate} req/s: {wall:.1f} s, TTFT p90 {row['ttft_p90_ms']:.1f} ms, "
                  f"TPOT p50/p90 {row['tpot_p50_ms']:.2f}/{row['tpot_p90_ms']:.2f} ms")
            if args.profile:
                s = row["simulated"]
                print(f"  simulated: TTFT p90 {s['ttft_p90_ms']:.1f} ms, TPOT p50/p90 "
                      f"{s['tpot_p50_ms']:.2f}/{s['tpot_p90_ms']:.2f} ms")
            if "per_message_us" in row:
                m = row["per_message_us"]
                print(f"  CPU per streamed message: decode worker outside steps {m['decode']:.0f} us,"
                      f" router {m['router']:.0f} us")
            print("  inter-token gap, mean (p90 bucket bound): " + ", ".join(
                f"{role} {v['mean_ms']:.2f} ms (<= {v['p90_le_ms']:g})"
                for role, v in row["itl"].items()))
            for role, e in row["engine_loop"].items():
                print(f"  {role} engine loop: {e['steps']:.0f} steps, mean batch "
                      f"{e['mean_batch']:.1f}, step {e['step_ms']:.2f} ms wall / "
                      f"{e['step_cpu_ms']:.2f} ms CPU; busy: steps {100 * e['step_share']:.0f}%, "
                      f"tasks {100 * e['tasks_share']:.0f}%, outputs {100 * e['outputs_share']:.0f}%")
            print("  process          cpu %  ms/request  delay %  busiest thread: cpu % delay %")
            for name, v in row["processes"].items():
                line = (f"  {name:15s} {100 * v['cpu'] / wall:6.1f} "
                        f"{1e3 * v['cpu'] / args.num_requests:10.2f}")
                if v["delay"] is not None:
                    line += (f" {100 * v['delay'] / wall:8.1f}  {100 * v['busiest']['cpu'] / wall:20.1f}"
                             f" {100 * v['busiest']['delay'] / wall:7.1f}")
                print(line)
            if args.profile:
                cpu = {k.split("@")[0]: v["cpu"] for k, v in row["processes"].items()}
                busy = row["simulated_busy_seconds"]
                if mode == "disaggregated":
                    print(f"  simulated busy s: prefill {busy['prefill']:.2f} (measured CPU "
                          f"{cpu['prefill']:.2f}), decode {busy['engine']:.2f} ({cpu['decode']:.2f})")
                else:
                    print(f"  simulated busy s: both workers {busy['engine']:.2f} (measured CPU "
                          f"{sum(v['cpu'] for k, v in row['processes'].items() if k.startswith('decode')):.2f})")
    finally:
        cluster.down()
if args.json_out:
    with open(args.json_out, "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
