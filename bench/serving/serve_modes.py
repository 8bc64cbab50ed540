#!/usr/bin/env python3
"""`tandem serve` configurations against each other on one machine (issue: `tandem serve` on one
machine). Each configuration is one `tandem serve` process given every core; `tandem bench`
drives it closed loop (--max-concurrency N, --request-rate inf) with random prompts of
--input-len token ids and --output-len greedy output tokens, EOS ignored, at each concurrency.
Prints a markdown table (output tok/s, TTFT p50, TPOT p50) and writes the raw JSON.

  /usr/bin/python3 bench/serving/serve_modes.py --build build --model /tmp/m125 \
      --config default= --config colocated="--set serve.mode=colocated" --streams 1,4,16

A configuration is NAME=ARGS (NAME without "="; ARGS: extra `tandem serve` arguments, split on
spaces). Each run has its own seed, so no prompt is a prefix-cache hit from an earlier run.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--model", required=True)
p.add_argument("--config", action="append", default=[], help="NAME=ARGS, repeatable")
p.add_argument("--streams", default="1,4,16")
p.add_argument("--input-len", type=int, default=256)
p.add_argument("--output-len", type=int, default=64)
p.add_argument("--requests-per-stream", type=int, default=4)
p.add_argument("--min-requests", type=int, default=12)
p.add_argument("--repeats", type=int, default=1, help="runs per cell; the median is reported")
p.add_argument("--out", default="")
args = p.parse_args()
tandem = os.path.join(args.build, "tools", "tandem", "tandem")
configs = [c.split("=", 1) for c in (args.config or ["default="])]
streams = [int(s) for s in args.streams.split(",")]
logs = tempfile.mkdtemp(prefix="tandem_serve_modes_")


def slug(name):
    return re.sub(r"[^A-Za-z0-9]+", "_", name)


def serve(name, extra):
    log = open(os.path.join(logs, slug(name) + ".log"), "w")
    cmd = [tandem, "serve", "--model", args.model, "--listen", "127.0.0.1:0"] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    m = re.search(r"router on ([^;\s]+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"serve {name} did not start: {line!r} (log {log.name})")
    return proc, m.group(1), line.strip()


def bench(addr, n, seed, out_json):
    # Each run its own seed: prompts seen before would be prefix-cache hits.
    requests = max(args.min_requests, n * args.requests_per_stream)
    subprocess.run([tandem, "bench", "--addr", addr, "--num-requests", str(requests),
                    "--max-concurrency", str(n), "--request-rate", "inf", "--seed", str(seed),
                    "--input-len", str(args.input_len), "--output-len", str(args.output_len),
                    "--vocab-size", "4096", "--json-out", out_json, "--progress", "false"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out_json) as f:
        return json.load(f)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


results = {}
for name, extra in configs:
    proc, addr, line = serve(name, extra.split())
    print(f"# {name}: {line}", file=sys.stderr)
    try:
        bench(addr, 1, 999, os.path.join(logs, "warmup.json"))
        for n in streams:
            runs = [bench(addr, n, 1000 * n + r, os.path.join(logs, f"{slug(name)}-{n}-{r}.json"))
                    for r in range(args.repeats)]
            cell = {"output_tok_s": median([r["output_throughput"] for r in runs]),
                    "ttft_p50_ms": median([r["ttft_ms"]["p50"] for r in runs]),
                    "tpot_p50_ms": median([r["tpot_ms"]["p50"] for r in runs]),
                    "failed": sum(r["failed"] for r in runs)}
            results.setdefault(name, {})[n] = cell
            print(f"#   {n} streams: {cell}", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait()

header = "| configuration | " + " | ".join(
    f"{n} stream{'s' if n > 1 else ''}: tok/s · TTFT p50 · TPOT p50" for n in streams) + " |"
print(header)
print("|---|" + "---|" * len(streams))
for name, _ in configs:
    cells = [results[name][n] for n in streams]
    print(f"| {name} | " + " | ".join(
        f"{c['output_tok_s']:.0f} · {c['ttft_p50_ms']:.0f} ms · {c['tpot_p50_ms']:.1f} ms"
        + (f" ({c['failed']} failed)" if c["failed"] else "") for c in cells) + " |")
if args.out:
    with open(args.out, "w") as f:
        json.dump({"input_len": args.input_len, "output_len": args.output_len,
                   "results": results}, f, indent=1)
