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
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from router_cost import Roles, measured_burst, summarize, write_json  # noqa: E402

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
roles = Roles(tandem, args.model, work)


def main():
    try:
        _, decode, _ = roles.start("decode", [])
        router, grpc_addr, line = roles.start("router", [
            "--set", "router.mode=colocated", "--set", f"router.decode_workers=[{decode}]",
            "--http-listen", "127.0.0.1:0", "--set", f"router.max_queued_requests={args.requests}"])
        http_addr = re.search(r"; http (\S+)", line).group(1)
        runs = {"grpc": [], "http": []}
        for r in range(args.rounds):
            for api in (("grpc", "http") if r % 2 == 0 else ("http", "grpc")):
                run = measured_burst(tandem, args, router,
                                     grpc_addr if api == "grpc" else http_addr,
                                     os.path.join(work, f"{api}-{r}.json"), r, ["--api", api])
                runs[api].append(run)
                print(f"{api:4} round {r}: {run}", flush=True)
        summary = summarize(runs)
        ratio = (summary["http"]["router_cpu_us_per_token_median"] /
                 summary["grpc"]["router_cpu_us_per_token_median"])
        print(f"router CPU per output token, median of {args.rounds}: "
              f"grpc {summary['grpc']['router_cpu_us_per_token_median']} us, "
              f"http {summary['http']['router_cpu_us_per_token_median']} us, "
              f"http/grpc {ratio:.2f}; failed: grpc {summary['grpc']['failed']}, "
              f"http {summary['http']['failed']}")
        if args.out:
            write_json(args.out, args, runs, summary, "http_over_grpc", ratio)
    finally:
        roles.stop()


main()
