#!/usr/bin/env python3
"""The planner's simulator against real Tandem processes on this machine (issue #21, part 3).

For each workload, both deployments of disagg_vs_colocated.py (the same two cores: colocated 2
decode workers, or disaggregated 1 prefill + 1 decode, one compute thread per worker) are
measured with `tandem bench` at each rate, and `tandem plan --deployment ... --rates ...`
predicts the same points from a one-thread engine profile of the model (engine-bench
--threads 1 --profile-out, then kv-handoff-bench --profile). Prints measured against predicted
TTFT p90, TPOT p90 and goodput with the relative error, writes JSON and PNG plots. With
--repeat N every point runs N times (the deployments alternating) and the prediction is compared
with the median, the range beside it: on a shared host the same point moves by up to 2x between
runs minutes apart.

  /usr/bin/python3 bench/serving/validate_planner.py --build build --calibrate --repeat 3 \\
      --workloads decode-heavy,prefill-heavy,mixed,trace --out docs/figures/planner_validation
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts", "train"))
import png  # noqa: E402  (the project's dependency-free PNG plotter)
from local_cluster import (DEPLOYMENTS, WORKLOADS, LocalCluster, bench, profile_for,  # noqa: E402
                           cpu_of_run)


p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--workloads", default="decode-heavy,prefill-heavy,mixed")
p.add_argument("--num-requests", type=int, default=100)
p.add_argument("--rates", default="", help="override every workload's rates")
p.add_argument("--replay", default="",
               help="no runs: predict the measurements of an earlier --out JSON again from the "
               "profiles as they are now")
p.add_argument("--deployments", default="colocated,disaggregated",
               help="of local_cluster.py's DEPLOYMENTS; colocated-2t is one worker on both "
               "cores, simulated on the workload's two-thread profile")
p.add_argument("--repeat", type=int, default=1,
               help="runs of every point, the deployments alternating; the table compares the "
               "prediction with the median and shows the range")
p.add_argument("--out", default="docs/figures/planner_validation")
p.add_argument("--calibrate", action="store_true",
               help="first measure the serving stack's CPU per streamed message and per prompt "
               "handed off and imported (disaggregated runs: calibrate()) and write them into "
               "the workloads' profiles")
args = p.parse_args()
tandem = os.path.join(args.build, "tools", "tandem", "tandem")
logs = tempfile.mkdtemp(prefix="tandem_planner_")


def predict(profile, deployment, rates, workload, extra=()):
    flags = list(extra)
    for key, value in workload.items():
        flags += ["--" + key.replace("_", "-"), str(value)]
    out = subprocess.run([tandem, "plan", "--profile", profile, "--deployment", deployment,
                          "--rates", rates, "--max-num-seqs", "64", "--json"] + flags,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def disaggregated_runs(name, rates, seed):
    """cpu_of_run of a disaggregated run of workload `name` at each of `rates`."""
    model, _, _, flags = WORKLOADS[name]
    runs = []
    cluster = LocalCluster(tandem, model, logs)
    addr = cluster.up("disaggregated")
    try:
        bench(tandem, addr, float(rates[0]), dict(flags, num_requests=10, seed=1000),
              os.path.join(logs, "warmup.json"))
        for i, rate in enumerate(rates):
            workload = dict(flags, num_requests=args.num_requests, seed=seed + i)
            runs.append(cpu_of_run(cluster, lambda: bench(
                tandem, addr, float(rate), workload, os.path.join(logs, "calibrate.json"))))
    finally:
        cluster.down()
    return runs


def steps_cpu(loops, role):
    return loops[role]["step_cpu_ms"] * loops[role]["steps"] / 1e3


def per_request_costs(runs, token):
    """import_overhead_seconds and handoff_overhead_seconds over `runs`, given the per-message
    cost `token` (the prefill worker streams one message per request)."""
    n = sum(m["completed"] for m, _, _, _ in runs)
    tasks = sum(loops["decode"]["tasks_share"] * wall for _, wall, _, loops in runs)
    handoff = sum(cpu["prefill"] - steps_cpu(loops, "prefill") for _, _, cpu, loops in runs)
    return {"import_overhead_seconds": tasks / n, "handoff_overhead_seconds": handoff / n - token}


def write_profile(path, values):
    # Into the profile it was measured against only: a profile measured at another time (another
    # model, or the host busier) has step times of its own, and the stack's share with them.
    with open(path) as f:
        prof = json.load(f)
    prof.update({k: max(0.0, v) for k, v in values.items()})
    with open(path, "w") as f:
        json.dump(prof, f, indent=2)
        f.write("\n")
    print(f"calibrated {path}: " + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in values.items()))


def calibrate(names):
    """The serving stack's costs the engine profile cannot see, measured from CPU time over
    disaggregated runs, one token per message, and written into the profiles:
      token_overhead_seconds   the decode worker's CPU outside its steps and tasks, per message
      import_overhead_seconds  its engine loop's tasks (admitting and importing), per request
      handoff_overhead_seconds the prefill worker's CPU outside its steps, per request, less
                               its one message's token_overhead_seconds
      shared_overhead_seconds, shared_step_overhead_seconds
                               the router's, store shard's and bench client's CPU, fitted as a
                               cost per message plus one per step that streams (each decode
                               step, and the prefill step that finishes each prompt)
    (messages: each request's first token from prefill, then one per token from decode). The
    per-message costs come from two runs of the decode-heavy workload, at its lowest and
    highest rate (seeds of their own); the per-request ones, which grow with the KV a prompt
    hands over, from those for its profile and from one run at the highest rate of the first
    workload in `names` of each other profile."""
    _, profile, rates, _ = WORKLOADS["decode-heavy"]
    runs = disaggregated_runs("decode-heavy", [rates.split(",")[0], rates.split(",")[-1]], 500)
    n = sum(m["completed"] for m, _, _, _ in runs)
    messages = sum(m["total_output_tokens"] for m, _, _, _ in runs)
    tasks = sum(loops["decode"]["tasks_share"] * wall for _, wall, _, loops in runs)
    token = (sum(cpu["decode"] - steps_cpu(loops, "decode") for _, _, cpu, loops in runs)
             - tasks) / (messages - n)
    # shared CPU = per_step * steps + per_message * messages, solved over the two runs.
    (s1, m1, c1), (s2, m2, c2) = (
        (loops["decode"]["steps"] + m["completed"], m["total_output_tokens"],
         cpu["router"] + cpu["cache-store"] + cpu["bench"]) for m, _, cpu, loops in runs)
    det = s1 * m2 - s2 * m1
    per_step = (c1 * m2 - c2 * m1) / det if det else 0.0
    per_message = (s1 * c2 - s2 * c1) / det if det else 0.0
    # Solvable only when the runs' steps carry clearly different numbers of messages (runs too
    # short to build batches do not), and only as costs: else one cost per message.
    if per_step < 0 or per_message < 0 or max(s1 / m1, s2 / m2) < 2 * min(s1 / m1, s2 / m2):
        per_step, per_message = 0.0, (c1 + c2) / (m1 + m2)
    for (m, wall, _, _), (steps, msgs, shared) in zip(runs, ((s1, m1, c1), (s2, m2, c2))):
        print(f"calibration run: {m['completed']} requests in {wall:.1f} s, {msgs} messages in "
              f"{steps:.0f} streaming steps, shared processes {1e6 * shared / msgs:.0f} us per "
              f"message")
    stack = {"token_overhead_seconds": token, "shared_overhead_seconds": per_message,
             "shared_step_overhead_seconds": per_step}
    write_profile(profile, dict(stack, **per_request_costs(runs, token)))
    done = {profile}
    for name in names:
        _, other, rates, _ = WORKLOADS[name]
        if other in done:
            continue
        done.add(other)
        runs = disaggregated_runs(name, [rates.split(",")[-1]], 600)
        write_profile(other, dict(stack, **per_request_costs(runs, token)))


def error(predicted, measured):
    return (predicted - measured) / measured if measured else float("inf")


if args.calibrate:
    calibrate(args.workloads.split(","))
# (name, plot label, measured, predicted) of each compared figure.
METRICS = (("ttft", "P90 TTFT (MS)", lambda m: m["ttft_ms"]["p90"],
            lambda s: s["ttft_seconds"]["p90"] * 1e3),
           ("tpot", "P90 TPOT (MS)", lambda m: m["tpot_ms"]["p90"],
            lambda s: s["tpot_seconds"]["p90"] * 1e3),
           ("goodput", "GOODPUT (PER S)", lambda m: m.get("goodput", 0),
            lambda s: s["goodput"]))

results = {}
measured_with = vars(args)  # the arguments of the runs (a replay's: those of its --out JSON)
if args.replay:
    # Measurements of an earlier run, predicted again from the profiles as they are now.
    with open(args.replay) as f:
        earlier = json.load(f)
    results = earlier["results"]
    measured_with = earlier["args"]
    args.repeat = measured_with["repeat"]
    for name, modes in results.items():
        _, profile, _, _ = WORKLOADS[name]
        for mode, r in modes.items():
            for run in r["runs"]:
                run["predicted"] = [predict(profile_for(mode, profile), DEPLOYMENTS[mode], rate,
                                            w)[0]
                                    for rate, w in zip(run["rates"], run["workloads"])]
for name in [] if args.replay else args.workloads.split(","):
    model, profile, rates, flags = WORKLOADS[name]
    rates = (args.rates or rates).split(",")
    modes = args.deployments.split(",")
    results[name] = {mode: {"runs": []} for mode in modes}
    cluster = LocalCluster(tandem, model, logs)
    # Repetitions alternate the deployments, so a change in the host's speed reaches both.
    for rep in range(args.repeat):
        # Each rate and repetition sends prompts of its own seed: the same prompts again would
        # hit the prefix cache an earlier run filled. The prediction simulates the same requests.
        workloads = [dict(flags, num_requests=args.num_requests, seed=100 * rep + i + 1)
                     for i in range(len(rates))]
        for mode in modes:
            deployment = DEPLOYMENTS[mode]
            addr = cluster.up(mode)
            try:
                bench(tandem, addr, float(rates[0]), dict(flags, num_requests=10, seed=1000),
                      os.path.join(logs, "warmup.json"))  # page in weights, warm caches
                measured = [bench(tandem, addr, float(r), w,
                                  os.path.join(logs, f"{name}-{mode}-{r}.json"))
                            for r, w in zip(rates, workloads)]
            finally:
                cluster.down()
            predicted = [predict(profile_for(mode, profile), deployment, r, w)[0]
                         for r, w in zip(rates, workloads)]
            results[name][mode]["runs"].append({"measured": measured, "predicted": predicted,
                                                 "rates": rates, "workloads": workloads})


def point(runs, i, pick_m, pick_s):
    """A point's measured values over the repetitions, and the median prediction."""
    return (sorted(pick_m(run["measured"][i]) for run in runs),
            statistics.median(pick_s(run["predicted"][i]) for run in runs))


os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
with open(args.out + ".json", "w") as f:
    json.dump({"args": measured_with, "workloads": {k: WORKLOADS[k] for k in results},
               "results": results} | ({"replayed_with": vars(args)} if args.replay else {}),
              f, indent=1)

print(f"measured: the median of {args.repeat} run(s) [lowest-highest]; predicted (error "
      "against the median)")
print("| workload | deployment | req/s | TTFT p90 ms | TPOT p90 ms | goodput req/s |")
print("|---|---|---|---|---|---|")
for name, modes in results.items():
    for mode, r in modes.items():
        for i, s in enumerate(r["runs"][0]["predicted"]):
            cells = []
            for _, _, pick_m, pick_s in METRICS:
                values, sv = point(r["runs"], i, pick_m, pick_s)
                mv = statistics.median(values)
                spread = f" [{values[0]:.3g}-{values[-1]:.3g}]" if len(values) > 1 else ""
                cells.append(f"{mv:.3g}{spread} / {sv:.3g} ({error(sv, mv):+.0%})")
            print(f"| {name} | {mode} | {s['rate']:g} | " + " | ".join(cells) + " |")

blue, red, green = (30, 70, 200), (200, 50, 40), (40, 150, 60)
for name, modes in results.items():
    for metric, label, pick_m, pick_s in METRICS:
        series = []
        for mode, color in (("disaggregated", blue), ("colocated", red),
                            ("colocated-2t", green)):
            if mode not in modes:
                continue
            runs = modes[mode]["runs"]
            xs = [s["rate"] for s in runs[0]["predicted"]]
            points = [point(runs, i, pick_m, pick_s) for i in range(len(xs))]
            series.append((xs, [statistics.median(v) for v, _ in points], color, 3))
            series.append((xs, [sv for _, sv in points], tuple(c // 2 + 110 for c in color), 1))
        ys = [y for s in series for y in s[1]]
        png.line_plot(f"{args.out}_{name}_{metric}.png", series,
                      f"{name.upper()} {label}: BLUE DISAGG, RED COLOC, GREEN 1 WORKER 2 THREADS; "
                      "THIN = PREDICTED",
                      "ARRIVAL RATE (PER S)", label, ylim=(0, max(ys) * 1.1 or 1))
print(f"wrote {args.out}.json and {args.out}_<workload>_{{tpot,ttft,goodput}}.png")
