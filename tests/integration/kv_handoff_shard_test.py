#!/usr/bin/env python3
"""kv-handoff-bench --shard against a real `tandem cache-store` process: both paths (the gRPC
stream and shared memory) complete against it, and the shard's own /metrics count the blocks
put, so the bytes went through that process and not a shard inside the bench."""
import argparse
import re
import subprocess
import sys
import time
import urllib.request


def puts(metrics_url):
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in
               re.finditer(r"^tandem_cache_store_puts_total\{[^}]*\} (\S+)$", text, re.M))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tandem", required=True)
    p.add_argument("--bench", required=True)
    p.add_argument("--model", required=True)
    args = p.parse_args()
    shard = subprocess.Popen(
        [args.tandem, "cache-store", "--model", args.model, "--listen", "127.0.0.1:0",
         "--metrics-listen", "127.0.0.1:0", "--set", "cache_store.capacity_bytes=64Mi"],
        stdout=subprocess.PIPE, text=True)
    try:
        line = shard.stdout.readline()
        address = re.search(r"serving on ([^;\s]+)", line).group(1)
        metrics = re.search(r"metrics (http://[^;\s]+)", line).group(1).rstrip("/")
        before = puts(metrics)
        out = subprocess.run([args.bench, "--block-sizes", "64Ki", "--total", "4Mi", "--request",
                              "1Mi", "--reps", "1", "--shard", address],
                             capture_output=True, text=True, timeout=300)
        print(out.stdout, out.stderr)
        assert out.returncode == 0, out.returncode
        for path in ("gRPC stream", "shared memory", "shm, reserved"):
            assert re.search(r"\| +64 KiB \| " + re.escape(path) + r" +\| +[0-9.]+ ", out.stdout), path
        # 3 rounds (2 warm-up) of 64 blocks through 3 paths.
        deadline = time.monotonic() + 10
        while puts(metrics) - before < 3 * 3 * 64 and time.monotonic() < deadline:
            time.sleep(0.1)  # the shard's counters follow its store's stats when scraped
        got = puts(metrics) - before
        assert got >= 3 * 3 * 64, f"the shard counted {got} puts"
        refused = subprocess.run([args.bench, "--shard", address, "--certs", "/tmp"],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "--certs" in refused.stderr, refused.stderr
    finally:
        shard.terminate()
        shard.wait()
    print("kv-handoff-bench --shard: ok")


if __name__ == "__main__":
    sys.exit(main())
