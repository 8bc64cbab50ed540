#!/usr/bin/env python3
"""What mutual TLS costs the router per streamed token, measured in one run.

Two deployments of the same shape, side by side: a `tandem router` (colocated) in front of one
`tandem decode` worker, each its own process, one in plaintext and one with every role on
mutual TLS (certificates from scripts/dev-certs.sh); the TLS one's clients connect over TLS too
(`tandem bench --ca-file`). Each round runs the same closed burst (N streaming requests at once)
against each, in alternating order; the figure is the router's CPU seconds (utime + stime from
/proc) per output token, median of the rounds.

usage: /usr/bin/python3 bench/serving/tls_cost.py --build build [--requests 300]
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
p.add_argument("--requests", type=int, default=300)
p.add_argument("--input-len", type=int, default=32)
p.add_argument("--output-len", type=int, default=64)
p.add_argument("--vocab-size", type=int, default=4096)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--out", default="")
args = p.parse_args()
tandem = os.path.join(args.build, "tools", "tandem", "tandem")
here = os.path.dirname(os.path.abspath(__file__))
work = tempfile.mkdtemp(prefix="tandem_tls_cost_")
certs = os.path.join(work, "certs")
procs = []


def tls(role):
    return ["--set", f"security.tls.ca_file={certs}/ca.pem",
            "--set", f"security.tls.cert_file={certs}/{role}.pem",
            "--set", f"security.tls.key_file={certs}/{role}.key"]


def start(role, extra):
    log = open(os.path.join(work, f"{role}-{len(procs)}.log"), "w")
    proc = subprocess.Popen([tandem, role, "--model", args.model, "--listen", "127.0.0.1:0",
                             "--metrics-listen", ""] + extra,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    m = re.search(r"serving on ([^;\s]+)", line)
    if not m:
        raise RuntimeError(f"{role} did not start: {line!r}")
    procs.append(proc)
    return proc, m.group(1)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(addr, extra, out):
    cmd = [tandem, "bench", "--addr", addr, "--num-requests", str(args.requests),
           "--max-concurrency", str(args.requests), "--request-rate", "inf",
           "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--vocab-size", str(args.vocab_size), "--json-out", out, "--progress=false"] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def deployment(secure):
    _, decode = start("decode", tls("decode") if secure else [])
    router, addr = start("router", [
        "--set", "router.mode=colocated", "--set", f"router.decode_workers=[{decode}]",
        "--set", f"router.max_queued_requests={args.requests}"] + (tls("router") if secure else []))
    # The router's certificate names localhost; clients verify it by that name.
    if secure:
        addr = "localhost:" + addr.rsplit(":", 1)[1]
    return router, addr


def main():
    subprocess.run([os.path.join(here, "..", "..", "scripts", "dev-certs.sh"), certs], check=True)
    try:
        plain = deployment(False)
        secure = deployment(True)
        setups = {"plaintext": (plain, []), "tls": (secure, ["--ca-file", f"{certs}/ca.pem"])}
        runs = {name: [] for name in setups}
        for r in range(args.rounds):
            order = ("plaintext", "tls") if r % 2 == 0 else ("tls", "plaintext")
            for name in order:
                (router, addr), extra = setups[name]
                before = cpu_seconds(router.pid)
                report = bench(addr, extra, os.path.join(work, f"{name}-{r}.json"))
                cpu = cpu_seconds(router.pid) - before
                tokens = report["total_output_tokens"]
                run = {"round": r, "completed": report["completed"], "failed": report["failed"],
                       "output_tokens": tokens, "router_cpu_s": round(cpu, 3),
                       "router_cpu_us_per_token": round(cpu / tokens * 1e6, 2),
                       "output_throughput": round(report["output_throughput"], 1),
                       "ttft_p50_ms": round(report["ttft_ms"]["p50"], 1)}
                runs[name].append(run)
                print(f"{name:9} round {r}: {run}", flush=True)
        summary = {name: {"router_cpu_us_per_token_median":
                          statistics.median(x["router_cpu_us_per_token"] for x in v),
                          "failed": sum(x["failed"] for x in v),
                          "completed": sum(x["completed"] for x in v)}
                   for name, v in runs.items()}
        ratio = (summary["tls"]["router_cpu_us_per_token_median"] /
                 summary["plaintext"]["router_cpu_us_per_token_median"])
        print(f"router CPU per output token, median of {args.rounds}: plaintext "
              f"{summary['plaintext']['router_cpu_us_per_token_median']} us, TLS "
              f"{summary['tls']['router_cpu_us_per_token_median']} us, TLS/plaintext {ratio:.2f}; "
              f"failed: {summary['plaintext']['failed']} / {summary['tls']['failed']}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"config": vars(args), "runs": runs, "summary": summary,
                           "tls_over_plaintext": round(ratio, 3)}, f, indent=2)
                f.write("\n")
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait()


main()
