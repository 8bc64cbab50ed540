#!/usr/bin/env python3
"""The router's cost per streamed token through its two front doors, measured in one run.

A `tandem router` (colocated, --http-listen) in front of one `tandem decode` worker, each its own
process, so the router's CPU time (utime + stime from /proc) is its own. Each round runs the
same closed burst (N requests at once, all streaming) through gRPC (`tandem bench`) and
through the OpenAI HTTP API (`tandem bench --api http`, one connection per request), in
alternating order; the figure is the router's CPU seconds per output token, median of the
rounds.

usage: /usr/bin/python3 bench/serving/http_vs_grpc.py --build build [--requests 1000]
           [--input-len 32] [--output-len 64] [--rounds 3] [--out FILE.json]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--model", default="models/tandem-py-8l")
p.add_argument("--requests", type=int, default=1000)
p.add_argument("--input-len", type=int, default=32)
p.add_argument("--output-len", type=int, default=64)
p.add_argument("--vocab-size", type=int, default=4096)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--out", default="")
args = p.parse_args()
tandem = os.path.join(args.build, "tools", "tandem", "tandem")
work = tempfile.mkdtemp(prefix="tandem_http_vs_grpc_")
procs = []


def start(role, extra):
    log = open(os.path.join(work, f"{role}.log"), "w")
    proc = subprocess.Popen([tandem, role, "--model", args.model, "--listen", "127.0.0.1:0",
                             "--metrics-listen", ""] + extra,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    m = re.search(r"serving on ([^;\s]+)", line)
    if not m:
        raise RuntimeError(f"{role} did not start: {line!r}")
    procs.append(proc)
    return proc, m.group(1), line


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(api, addr, out):
    cmd = [tandem, "bench", "--addr", addr, "--api", api, "--num-requests", str(args.requests),
           "--max-concurrency", str(args.requests), "--request-rate", "inf",
           "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--vocab-size", str(args.vocab_size), "--json-out", out, "--progress=false"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def main():
    try:
        _, decode, _ = start("decode", [])
        router, grpc_addr, line = start("router", [
            "--set", "router.mode=colocated", "--set", f"router.decode_workers=[{decode}]",
            "--http-listen", "127.0.0.1:0", "--set", f"router.max_queued_requests={args.requests}"])
        http_addr = re.search(r"; http (\S+)", line).group(1)
        runs = {"grpc": [], "http": []}
        for r in range(args.rounds):
            for api in (("grpc", "http") if r % 2 == 0 else ("http", "grpc")):
                before = cpu_seconds(router.pid)
                report = bench(api, grpc_addr if api == "grpc" else http_addr,
                               os.path.join(work, f"{api}-{r}.json"))
                cpu = cpu_seconds(router.pid) - before
                tokens = report["total_output_tokens"]
                run = {"round": r, "completed": report["completed"], "failed": report["failed"],
                       "output_tokens": tokens, "router_cpu_s": round(cpu, 3),
                       "router_cpu_us_per_token": round(cpu / tokens * 1e6, 2),
                       "output_throughput": round(report["output_throughput"], 1),
                       "ttft_p50_ms": round(report["ttft_ms"]["p50"], 1),
                       "tpot_p50_ms": round(report["tpot_ms"]["p50"], 2)}
                runs[api].append(run)
                print(f"{api:4} round {r}: {run}", flush=True)
        summary = {api: {"router_cpu_us_per_token_median":
                         statistics.median(x["router_cpu_us_per_token"] for x in v),
                         "failed": sum(x["failed"] for x in v),
                         "completed": sum(x["completed"] for x in v)}
                   for api, v in runs.items()}
        ratio = (summary["http"]["router_cpu_us_per_token_median"] /
                 summary["grpc"]["router_cpu_us_per_token_median"])
        print(f"router CPU per output token, median of {args.rounds}: "
              f"grpc {summary['grpc']['router_cpu_us_per_token_median']} us, "
              f"http {summary['http']['router_cpu_us_per_token_median']} us, "
              f"http/grpc {ratio:.2f}; failed: grpc {summary['grpc']['failed']}, "
              f"http {summary['http']['failed']}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"config": vars(args), "runs": runs, "summary": summary,
                           "http_over_grpc": round(ratio, 3)}, f, indent=2)
                f.write("\n")
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait()


main()
