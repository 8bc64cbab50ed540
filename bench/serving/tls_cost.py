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
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from router_cost import Roles, measured_burst, summarize, write_json  # noqa: E402

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
roles = Roles(tandem, args.model, work)


def tls(role):
    return ["--set", f"security.tls.ca_file={certs}/ca.pem",
            "--set", f"security.tls.cert_file={certs}/{role}.pem",
            "--set", f"security.tls.key_file={certs}/{role}.key"]


def deployment(secure):
    _, decode, _ = roles.start("decode", tls("decode") if secure else [])
    router, addr, _ = roles.start("router", [
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
                run = measured_burst(tandem, args, router, addr,
                                     os.path.join(work, f"{name}-{r}.json"), r, extra)
                runs[name].append(run)
                print(f"{name:9} round {r}: {run}", flush=True)
        summary = summarize(runs)
        ratio = (summary["tls"]["router_cpu_us_per_token_median"] /
                 summary["plaintext"]["router_cpu_us_per_token_median"])
        print(f"router CPU per output token, median of {args.rounds}: plaintext "
              f"{summary['plaintext']['router_cpu_us_per_token_median']} us, TLS "
              f"{summary['tls']['router_cpu_us_per_token_median']} us, TLS/plaintext {ratio:.2f}; "
              f"failed: {summary['plaintext']['failed']} / {summary['tls']['failed']}")
        if args.out:
            write_json(args.out, args, runs, summary, "tls_over_plaintext", ratio)
    finally:
        roles.stop()


main()
