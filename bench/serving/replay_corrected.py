#!/usr/bin/env python3
"""An earlier validate_planner.py run predicted again on its profile corrected as the router
corrects it (planner.correction, docs/planner.md): the correction factors fitted to the
measured mean TTFT and TPOT at one rate (`tandem plan --live`, the median over the runs), then
every rate's p90s and goodput predicted on the profile scaled by them (`tandem plan
--deployment`, the runs' own requests) and compared with the measured medians.

  /usr/bin/python3 bench/serving/replay_corrected.py --build build \\
      --run docs/figures/planner_validation_decode-heavy-x5.json --fit-rate 16
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import DEPLOYMENTS, profile_for  # noqa: E402


def flags(workload):
    out = []
    for key, value in workload.items():
        out += ["--" + key.replace("_", "-"), str(value)]
    return out


def corrected(profile, c):
    """planner::Corrected: the prefill steps and handoff overhead times c["prefill"], the decode
    steps and per-message overheads times c["decode"]."""
    p = json.loads(json.dumps(profile))
    for s in p["prefill"]:
        s["seconds"] *= c["prefill"]
    p["handoff_overhead_seconds"] = p.get("handoff_overhead_seconds", 0) * c["prefill"]
    for s in p["decode"]:
        s["seconds"] *= c["decode"]
    for key in ("token_overhead_seconds", "import_overhead_seconds"):
        p[key] = p.get(key, 0) * c["decode"]
    return p


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--run", required=True, help="a validate_planner.py --out JSON")
    p.add_argument("--fit-rate", required=True, help="the rate whose means the factors fit")
    p.add_argument("--out-profile", default="/tmp/replay_corrected_profile.json")
    args = p.parse_args()
    tandem = os.path.join(args.build, "tools/tandem/tandem")
    with open(args.run) as f:
        run = json.load(f)
    print("| workload | deployment | factors prefill / decode | req/s | TTFT p90 ms measured / "
          "predicted | TPOT p90 ms | goodput req/s |")
    print("|---|---|---|---|---|---|---|")
    for name, modes in run["results"].items():
        profile_path = run["workloads"][name][1]
        for mode, r in modes.items():
            runs = r["runs"]
            rates = runs[0]["rates"]
            i = rates.index(args.fit_rate)

            def median(j, key, stat):
                return statistics.median(x["measured"][j][key][stat] for x in runs)

            with open(profile_for(mode, profile_path)) as f:
                profile = json.load(f)
            live = DEPLOYMENTS[mode]
            fit = json.loads(subprocess.run(
                [tandem, "plan", "--profile", profile_for(mode, profile_path), "--rate",
                 args.fit_rate, "--json", "--only", live.split(":")[0], "--max-num-seqs", "64",
                 "--num-requests", str(runs[0]["workloads"][i]["num_requests"]), "--live", live,
                 "--measured-ttft-ms", str(median(i, "ttft_ms", "mean")),
                 "--measured-tpot-ms", str(median(i, "tpot_ms", "mean"))]
                + flags({k: v for k, v in runs[0]["workloads"][i].items()
                         if k not in ("num_requests", "seed")}),
                check=True, capture_output=True, text=True).stdout)[0]["correction"]
            with open(args.out_profile, "w") as f:
                json.dump(corrected(profile, fit), f)
            for j, rate in enumerate(rates):
                predicted = [json.loads(subprocess.run(
                    [tandem, "plan", "--profile", args.out_profile, "--deployment", live,
                     "--rates", rate, "--max-num-seqs", "64", "--json"]
                    + flags(x["workloads"][j]), check=True, capture_output=True,
                    text=True).stdout)[0] for x in runs]
                cells = []
                for key, pick, scale in (("ttft_ms", "ttft_seconds", 1e3),
                                         ("tpot_ms", "tpot_seconds", 1e3)):
                    m = median(j, key, "p90")
                    s = statistics.median(x[pick]["p90"] for x in predicted) * scale
                    cells.append(f"{m:.3g} / {s:.3g} ({s / m - 1:+.0%})")
                mg = statistics.median(x["measured"][j]["goodput"] for x in runs)
                sg = statistics.median(x["goodput"] for x in predicted)
                cells.append(f"{mg:.3g} / {sg:.3g} ({sg / mg - 1:+.0%})" if mg else
                             f"{mg:.3g} / {sg:.3g}")
                print(f"| {name} | {mode} | {fit['prefill']:.3f} / {fit['decode']:.3f} | {rate} | "
                      + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
