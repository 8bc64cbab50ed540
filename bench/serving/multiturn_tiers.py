#!/usr/bin/env python3
"""Multi-turn chat against the store's tiers (issue #22): DRAM only against DRAM + disk at the
same DRAM size.

Conversations grow turn by turn: turn t of a conversation repeats its t earlier 512-token
blocks and adds one (Mooncake trace lines with hash_ids, `tandem bench --dataset`), and every
conversation's turn comes before any conversation's next turn, so between two turns of one
conversation the others push its KV out of every DRAM cache: the workers' own prefix caches
(kv_cache.memory_bytes) and the store shard's memory (cache_store.capacity_bytes). Both runs
are `tandem serve`, disaggregated, with cache_store.load_prefixes on (prefill imports what the
store holds); the second adds cache_store.disk. Reports TTFT p50/p99 (`tandem bench`), the
decode-side hit rate (tandem_kv_lookups_total{role="decode"}), the prompt tokens prefill
computed (tandem_prompt_tokens_total - tandem_cached_prompt_tokens_total: the work the tiers
save), the time the router waited on prefill calls (tandem_prefill_time_seconds_sum) and the
store's lookups per tier.

  /usr/bin/python3 bench/serving/multiturn_tiers.py --build build --conversations 24 --turns 3
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request

p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--model", default="models/tandem-py-8l")
p.add_argument("--conversations", type=int, default=24)
p.add_argument("--turns", type=int, default=3)
p.add_argument("--gap-ms", type=float, default=250, help="between arrivals")
p.add_argument("--output-len", type=int, default=16)
p.add_argument("--dram", default="4MiB", help="store memory, and each worker's KV cache")
p.add_argument("--disk", default="512MiB")
p.add_argument("--repeats", type=int, default=1, help="alternating runs per configuration")
p.add_argument("--out", default="")
args = p.parse_args()
tandem = os.path.join(args.build, "tools", "tandem", "tandem")
work = tempfile.mkdtemp(prefix="tandem_multiturn_")

trace = os.path.join(work, "multiturn.jsonl")
with open(trace, "w") as f:
    n = 0
    for t in range(args.turns):
        for c in range(args.conversations):
            f.write(json.dumps({"timestamp": n * args.gap_ms, "input_length": 512 * (t + 1),
                                "output_length": args.output_len,
                                "hash_ids": [c * 1000 + k for k in range(t + 1)]}) + "\n")
            n += 1


def metrics(url):
    out = {}
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        m = re.match(r"([a-z_]+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def pick(ms, name, **labels):
    total = 0.0
    for key, v in ms.items():
        if key.split("{")[0] == name and all(f'{k}="{w}"' in key for k, w in labels.items()):
            total += v
    return total


def run(name, extra, rep):
    disk_dir = os.path.join(work, f"disk-{rep}")
    cmd = [tandem, "serve", "--model", args.model, "--listen", "127.0.0.1:0",
           "--metrics-listen", "127.0.0.1:0", "--set", "serve.mode=disaggregated",
           "--set", f"cache_store.capacity_bytes={args.dram}",
           "--set", f"kv_cache.memory_bytes={args.dram}",
           "--set", "cache_store.load_prefixes=true"]
    if extra:
        cmd += ["--set", f"cache_store.disk.directory={disk_dir}",
                "--set", f"cache_store.disk.capacity_bytes={args.disk}",
                "--set", "cache_store.disk.segment_bytes=32MiB"]
    log = open(os.path.join(work, f"{name}-{rep}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    addr = re.search(r"router on ([^;\s]+)", line)
    url = re.search(r"metrics (\S+)", line)
    if not addr or not url:
        proc.kill()
        raise RuntimeError(f"serve did not start: {line!r} (log {log.name})")
    try:
        out_json = os.path.join(work, f"{name}-{rep}.json")
        subprocess.run([tandem, "bench", "--addr", addr.group(1), "--dataset", trace,
                        "--vocab-size", "4096", "--json-out", out_json, "--progress", "false"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out_json) as f:
            report = json.load(f)
        ms = metrics(url.group(1).rstrip(";"))
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(disk_dir, ignore_errors=True)
    hits = pick(ms, "tandem_kv_lookups_total", role="decode", result="hit")
    misses = pick(ms, "tandem_kv_lookups_total", role="decode", result="miss")
    return {
        "report": report,
        "ttft_p50_ms": report["ttft_ms"]["p50"], "ttft_p99_ms": report["ttft_ms"]["p99"],
        "decode_hit_rate": hits / max(1.0, hits + misses),
        "prompt_tokens": pick(ms, "tandem_prompt_tokens_total", role="router"),
        "cached_tokens": pick(ms, "tandem_cached_prompt_tokens_total", role="router"),
        "prefill_seconds": pick(ms, "tandem_prefill_time_seconds_sum", role="router"),
        "store_memory_hits": pick(ms, "tandem_cache_store_tier_lookups_total", tier="memory",
                                  result="hit"),
        "store_disk_hits": pick(ms, "tandem_cache_store_tier_lookups_total", tier="disk",
                                result="hit"),
        "store_misses": pick(ms, "tandem_cache_store_lookups_total", result="miss"),
        "failed": report.get("failed", 0),
    }


configs = [("DRAM only", False), ("DRAM + disk", True)]
results = {name: [] for name, _ in configs}
for rep in range(args.repeats):
    for name, disk in configs:
        r = run(name.replace(" ", "_").replace("+", "and"), disk, rep)
        results[name].append(r)
        print(f"# {name} run {rep + 1}: TTFT p50 {r['ttft_p50_ms']:.1f} ms", file=sys.stderr)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


print(f"{args.conversations} conversations x {args.turns} turns (512 new tokens a turn, "
      f"{args.output_len} out), an arrival every {args.gap_ms:.0f} ms; DRAM {args.dram} for "
      f"the store and each worker; disk {args.disk}; median of {args.repeats}\n")
print("| store | TTFT p50 ms | TTFT p99 ms | decode hit rate | prompt tokens computed | "
      "prefill calls s | store hits memory / disk | store misses |")
print("|---|---|---|---|---|---|---|---|")
for name, _ in configs:
    rs = results[name]
    print(f"| {name} | {median([r['ttft_p50_ms'] for r in rs]):.1f} | "
          f"{median([r['ttft_p99_ms'] for r in rs]):.1f} | "
          f"{median([r['decode_hit_rate'] for r in rs]):.3f} | "
          f"{median([r['prompt_tokens'] - r['cached_tokens'] for r in rs]):.0f} of "
          f"{median([r['prompt_tokens'] for r in rs]):.0f} | "
          f"{median([r['prefill_seconds'] for r in rs]):.2f} | "
          f"{median([r['store_memory_hits'] for r in rs]):.0f} / "
          f"{median([r['store_disk_hits'] for r in rs]):.0f} | "
          f"{median([r['store_misses'] for r in rs]):.0f} |")
if args.out:
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
shutil.rmtree(work, ignore_errors=True)
