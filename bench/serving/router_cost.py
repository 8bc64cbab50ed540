"""What http_vs_grpc.py and tls_cost.py share: `tandem` role processes of their own, the
router's CPU time from /proc, and closed bursts of `tandem bench` turned into per-token costs.
"""
import json
import os
import re
import statistics
import subprocess


class Roles:
    """`tandem ROLE` processes, each logging to WORK/ROLE-N.log; stop() ends them, last first."""

    def __init__(self, tandem, model, work):
        self.tandem, self.model, self.work = tandem, model, work
        self.procs = []

    def start(self, role, extra):
        """Starts `role` on a free loopback port: (process, its address, its startup line)."""
        log = open(os.path.join(self.work, f"{role}-{len(self.procs)}.log"), "w")
        proc = subprocess.Popen([self.tandem, role, "--model", self.model, "--listen",
                                 "127.0.0.1:0", "--metrics-listen", ""] + extra,
                                stdout=subprocess.PIPE, stderr=log, text=True)
        line = proc.stdout.readline()
        m = re.search(r"serving on ([^;\s]+)", line)
        if not m:
            raise RuntimeError(f"{role} did not start: {line!r}")
        self.procs.append(proc)
        return proc, m.group(1), line

    def stop(self):
        for proc in reversed(self.procs):
            proc.terminate()
            proc.wait()


def cpu_seconds(pid):
    """utime + stime of process `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def burst(tandem, args, addr, out, extra=()):
    """One closed burst of args.requests streaming requests at once; the bench report."""
    cmd = [tandem, "bench", "--addr", addr, "--num-requests", str(args.requests),
           "--max-concurrency", str(args.requests), "--request-rate", "inf",
           "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--vocab-size", str(args.vocab_size), "--json-out", out, "--progress=false"]
    subprocess.run(cmd + list(extra), check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def measured_burst(tandem, args, router, addr, out, r, extra=()):
    """A burst, and what it cost the router: the run's record for round `r`."""
    before = cpu_seconds(router.pid)
    report = burst(tandem, args, addr, out, extra)
    cpu = cpu_seconds(router.pid) - before
    tokens = report["total_output_tokens"]
    return {"round": r, "completed": report["completed"], "failed": report["failed"],
            "output_tokens": tokens, "router_cpu_s": round(cpu, 3),
            "router_cpu_us_per_token": round(cpu / tokens * 1e6, 2),
            "output_throughput": round(report["output_throughput"], 1),
            "ttft_p50_ms": round(report["ttft_ms"]["p50"], 1),
            "tpot_p50_ms": round(report["tpot_ms"]["p50"], 2)}


def summarize(runs):
    """Per setup: the median router CPU per token over the rounds, and the request counts."""
    return {name: {"router_cpu_us_per_token_median":
                   statistics.median(x["router_cpu_us_per_token"] for x in v),
                   "failed": sum(x["failed"] for x in v),
                   "completed": sum(x["completed"] for x in v)}
            for name, v in runs.items()}


def write_json(path, args, runs, summary, ratio_name, ratio):
    with open(path, "w") as f:
        json.dump({"config": vars(args), "runs": runs, "summary": summary,
                   ratio_name: round(ratio, 3)}, f, indent=2)
        f.write("\n")
