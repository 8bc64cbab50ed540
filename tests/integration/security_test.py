"""Mutual TLS between Tandem's roles, across real processes (issue 19, docs/security.md).

Certificates come from scripts/dev-certs.sh (openssl) at test time. A cluster of a store shard,
a prefill worker, a decode worker and a router, each its own `tandem` process with its own role
certificate, serves over TLS; then peers that should not get in try:
  - Registry/Register with no certificate, another role's, another CA's, an expired one;
  - CacheStore/Put with a decode certificate, Get with the router's;
  - DecodeWorker/Decode with a prefill certificate;
  - a real prefill worker whose certificate another CA signed.
Each is refused (PERMISSION_DENIED, counted in tandem_auth_denied_total, or a failed
handshake), and the cluster keeps serving. Certificates are rotated (to a second CA's, the CA
file trusting both) while 32 streams run: none fails, and a client trusting only the new CA
reaches the router afterwards. A role beyond loopback without TLS refuses to start; with
security.allow_insecure it starts and warns.

Usage: security_test.py --tandem BIN --model DIR --proto-dir DIR --dev-certs SCRIPT --work DIR
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import cluster

p = argparse.ArgumentParser()
p.add_argument("--tandem", required=True)
p.add_argument("--model", required=True)
p.add_argument("--proto-dir", required=True)
p.add_argument("--dev-certs", required=True)
p.add_argument("--work", required=True)
args = p.parse_args()
grpc, pb, pb_grpc = cluster.import_grpc(args.proto_dir)
from tandem.v1 import cache_store_pb2, cache_store_pb2_grpc, workers_pb2, workers_pb2_grpc  # noqa

ROLES = ("router", "prefill", "decode", "cache_store")


def certs(name, *extra):
    subprocess.run([args.dev_certs, os.path.join(args.work, name)] + list(extra), check=True,
                   stdout=subprocess.DEVNULL)


def read(*path):
    with open(os.path.join(args.work, *path), "rb") as f:
        return f.read()


def install(src, ca_bundle):
    """Each role's live files in work/live/ROLE: its certificate from `src`, the CA bundle.
    Written beside and renamed, as Kubernetes swaps a Secret's files."""
    for role in ROLES:
        d = os.path.join(args.work, "live", role)
        os.makedirs(d, exist_ok=True)
        for name, data in (("ca.pem", ca_bundle), ("tls.crt", read(src, f"{role}.pem")),
                           ("tls.key", read(src, f"{role}.key"))):
            with open(os.path.join(d, name + ".new"), "wb") as f:
                f.write(data)
            os.replace(os.path.join(d, name + ".new"), os.path.join(d, name))


def tls_args(role):
    d = os.path.join(args.work, "live", role.replace("-", "_"))
    return ["--set", f"security.tls.ca_file={d}/ca.pem", "--set", f"security.tls.cert_file={d}/tls.crt",
            "--set", f"security.tls.key_file={d}/tls.key", "--set", "security.tls.reload_seconds=1"]


def channel(address, ca, cert=None):
    """A gRPC TLS channel of its own, trusting `ca`, presenting `cert` (dir/name) if given."""
    key = chain = None
    if cert:
        key, chain = read(cert + ".key"), read(cert + ".pem")
    creds = grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=key,
                                         certificate_chain=chain)
    return grpc.secure_channel(address, creds, options=[("grpc.use_local_subchannel_pool", 1)])


def code_of(call):
    try:
        call()
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def generate(address, ca, max_tokens=8):
    stub = pb_grpc.InferenceStub(channel(address, ca))
    req = pb.GenerateRequest(prompt="def add(a, b):",
                             sampling=pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [t for m in stub.Generate(req, timeout=120) if m.HasField("chunk") for t in m.chunk.token_ids]


def check_refusals(c):
    router, store, decode = c.router, c.shards[0], c.decodes[0]
    denied = lambda proc, method, reason: proc.metric(  # noqa: E731
        "tandem_auth_denied_total", {"method": method, "reason": reason}) or 0
    register = lambda ch: workers_pb2_grpc.RegistryStub(ch).Register(  # noqa: E731
        workers_pb2.RegisterRequest(address="127.0.0.1:1", model_id="x"), timeout=10)

    # The router's port takes clients without certificates (the public API), so these reach
    # the registry's role check.
    assert code_of(lambda: register(channel(router.address, "a/ca.pem"))) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert code_of(lambda: register(channel(router.address, "a/ca.pem", "a/cache_store"))) == \
        grpc.StatusCode.PERMISSION_DENIED
    # Another CA's or an expired certificate fails the handshake.
    for bad in ("b/prefill", "a/expired"):
        assert code_of(lambda: register(channel(router.address, "a/ca.pem", bad))) == \
            grpc.StatusCode.UNAVAILABLE, bad
    cluster.wait_for(lambda: denied(router, "/tandem.v1.Registry/Register", "no_certificate") == 1
                     and denied(router, "/tandem.v1.Registry/Register", "role") == 1, 10,
                     "the router to count both refusals")
    # The handshakes it refused are counted too, by reason.
    cluster.wait_for(lambda: denied(router, "tls_handshake", "untrusted") >= 1
                     and denied(router, "tls_handshake", "expired") >= 1, 10,
                     "the router to count the other CA's and the expired certificate")

    # A decode worker may not write the store (a poisoned cache), the router may not read it.
    put = lambda ch: cache_store_pb2_grpc.CacheStoreStub(ch).Put(  # noqa: E731
        iter([cache_store_pb2.PutRequest(block_hash=1, model_id="x", block_bytes=4, data=b"abcd")]),
        timeout=10)
    get = lambda ch: list(cache_store_pb2_grpc.CacheStoreStub(ch).Get(  # noqa: E731
        cache_store_pb2.GetRequest(model_id="x", block_hashes=[1]), timeout=10))
    assert code_of(lambda: put(channel(store.address, "a/ca.pem", "a/decode"))) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert code_of(lambda: get(channel(store.address, "a/ca.pem", "a/router"))) == \
        grpc.StatusCode.PERMISSION_DENIED
    # The store's port asks every peer for a certificate: without one, no handshake.
    assert code_of(lambda: get(channel(store.address, "a/ca.pem"))) == grpc.StatusCode.UNAVAILABLE
    cluster.wait_for(lambda: denied(store, "/tandem.v1.CacheStore/Put", "role") == 1
                     and denied(store, "/tandem.v1.CacheStore/Get", "role") == 1
                     and denied(store, "tls_handshake", "no_certificate") >= 1, 10,
                     "the store to count the refusals and the certificate-less handshake")

    # Only the router calls workers.
    decode_call = lambda ch: list(workers_pb2_grpc.DecodeWorkerStub(ch).Decode(  # noqa: E731
        workers_pb2.DecodeRequest(request_id="x", token_ids=[1]), timeout=10))
    assert code_of(lambda: decode_call(channel(decode.address, "a/ca.pem", "a/prefill"))) == \
        grpc.StatusCode.PERMISSION_DENIED
    cluster.wait_for(lambda: denied(decode, "/tandem.v1.DecodeWorker/Decode", "role") == 1, 10,
                     "the decode worker to count the refusal")
    print("refusals: registry (no certificate, wrong role; other CA and expired in the "
          "handshake), store put/get (and a handshake without a certificate), "
          "decode: refused and counted")


def curl(url, *extra):
    return subprocess.run(["curl", "-sS", "--max-time", "60", *extra, url], capture_output=True,
                          text=True)


def check_https(c):
    """The HTTP door serves HTTPS with the router's certificate; plaintext gets nothing."""
    port = c.router.http_address.rsplit(":", 1)[1]
    ca = os.path.join(args.work, "a/ca.pem")
    out = curl(f"https://localhost:{port}/v1/completions", "--cacert", ca, "-H",
               "Content-Type: application/json", "-d",
               '{"model": "tandem-py-8l", "prompt": "def add(a, b):", "max_tokens": 4}')
    assert out.returncode == 0 and '"text"' in out.stdout, out
    assert curl(f"http://127.0.0.1:{port}/v1/models").returncode != 0
    assert curl(f"https://localhost:{port}/v1/models", "--cacert",
                os.path.join(args.work, "b/ca.pem")).returncode != 0  # another CA: untrusted
    print("HTTPS: curl verified the router's certificate; plaintext and other-CA clients refused")
    out = os.path.join(args.work, "bench-https.json")
    bench = subprocess.run([args.tandem, "bench", "--addr", f"localhost:{port}", "--api", "http",
                            "--ca-file", ca, "--num-requests", "16", "--input-len", "32",
                            "--output-len", "8", "--vocab-size", "256", "--json-out", out,
                            "--progress=false"], capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0, bench
    with open(out) as f:
        report = json.load(f)
    assert report["completed"] == 16 and report["failed"] == 0, report
    untrusted = subprocess.run([args.tandem, "bench", "--addr", f"localhost:{port}", "--api",
                                "http", "--ca-file", os.path.join(args.work, "b/ca.pem"),
                                "--num-requests", "1", "--vocab-size", "256", "--progress=false"],
                               capture_output=True, text=True, timeout=120)
    assert untrusted.returncode != 0, untrusted
    print("HTTPS: tandem bench --api http --ca-file: 16/16 streams; another CA's client refused")
    return ca


def check_serve_tls():
    """`tandem serve` on every interface with the router's certificate: its public ports, gRPC and
    HTTP, take TLS clients only; its roles inside talk over loopback."""
    proc = subprocess.Popen([args.tandem, "serve", "--model", args.model,
                             "--listen", "0.0.0.0:0", "--http-listen", "0.0.0.0:0",
                             "--metrics-listen", "127.0.0.1:0"] + tls_args("router"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"router on \S+:(\d+); metrics \S+; http \S+:(\d+);", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        grpc_port, http_port = m.group(1), m.group(2)
        ca = os.path.join(args.work, "a/ca.pem")
        out = subprocess.run([args.tandem, "generate", "--addr", f"localhost:{grpc_port}",
                              "--ca-file", ca, "--prompt", "def add(a, b):", "--max-tokens", "8"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "generate: finish" in out.stderr, out
        plain = subprocess.run([args.tandem, "generate", "--addr", f"127.0.0.1:{grpc_port}",
                                "--prompt", "x", "--max-tokens", "2", "--timeout", "10"],
                               capture_output=True, text=True, timeout=60)
        assert plain.returncode != 0, plain
        https = curl(f"https://localhost:{http_port}/v1/completions", "--cacert", ca, "-H",
                     "Content-Type: application/json", "-d",
                     '{"prompt": "def add(a, b):", "max_tokens": 4}')
        assert https.returncode == 0 and '"text"' in https.stdout, https
        assert curl(f"http://127.0.0.1:{http_port}/v1/models").returncode != 0
        print("tandem serve on 0.0.0.0 with the router's certificate: gRPC and HTTPS verified by "
              "their clients, plaintext refused on both")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def check_silent_clients(c):
    """Connections that never start a TLS handshake are cut off after the server's 10 s
    handshake timeout, while others are served meanwhile."""
    import socket
    host, port = c.router.address.rsplit(":", 1)
    silent = [socket.create_connection((host, int(port))) for _ in range(32)]
    t0 = time.monotonic()
    try:
        assert len(generate(c.router.address, "a/ca.pem")) == 8  # served meanwhile
        served_after = time.monotonic() - t0
        for s in silent:
            s.settimeout(30)
            while s.recv(4096):  # until the server closes it
                pass
        closed_after = time.monotonic() - t0
    finally:
        for s in silent:
            s.close()
    assert served_after < 8 and 8 < closed_after < 25, (served_after, closed_after)
    print(f"32 silent connections: a request served after {served_after:.1f} s; all cut off "
          f"after {closed_after:.1f} s")


def check_foreign_worker(c):
    """A real prefill worker whose certificate another CA signed never joins the pool."""
    d = os.path.join(args.work, "live", "intruder")
    os.makedirs(d, exist_ok=True)
    for name, data in (("ca.pem", read("b", "ca.pem")), ("tls.crt", read("b", "prefill.pem")),
                       ("tls.key", read("b", "prefill.key"))):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    intruder = cluster.Process(args.tandem, "prefill", c.worker_args + [
        "--set", f"security.tls.ca_file={d}/ca.pem", "--set", f"security.tls.cert_file={d}/tls.crt",
        "--set", f"security.tls.key_file={d}/tls.key"], c.log_dir)
    try:
        cluster.wait_for(lambda: "register failed" in open(intruder.log.name).read(), 30,
                         "the intruder's registration to fail")
        assert c.router.metric("tandem_workers", {"pool": "prefill"}) == 1
    finally:
        intruder.stop()
    print("a prefill worker from another CA: registration refused, pool unchanged")


def check_rotation(c):
    """32 streams run while every role's certificate is replaced by the second CA's. They are
    long enough (800 tokens) to outlast the reload on a loaded machine: with 200 they could all
    end while the router's new certificate was still being polled for."""
    n, tokens, results = 32, 800, []
    stub = pb_grpc.InferenceStub(channel(c.router.address, "a/ca.pem"))
    first = threading.Barrier(n + 1)

    def run(i):
        req = pb.GenerateRequest(prompt_token_ids=[1 + i, 2, 3, 4 + i],
                                 sampling=pb.SamplingParams(max_tokens=tokens, ignore_eos=True))
        got, waited = [], False
        try:
            for m in stub.Generate(req, timeout=300):
                got.extend(m.chunk.token_ids)
                if not waited and got:
                    waited = True
                    first.wait(timeout=120)
            return len(got), None
        except grpc.RpcError as e:
            return len(got), f"{e.code()} {e.details()}"

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(run, i) for i in range(n)]
        first.wait(timeout=120)  # every stream has its first token
        install("b", read("a", "ca.pem") + read("b", "ca.pem"))
        # New connections get the new certificate: a client trusting only CA b gets in.
        cluster.wait_for(lambda: code_of(lambda: generate(c.router.address, "b/ca.pem", 1)) ==
                         grpc.StatusCode.OK, 30, "the router to serve CA b's certificate")
        rotated_while = sum(1 for f in futures if not f.done())
        # The HTTP door's new connections get the new certificate too.
        port = c.router.http_address.rsplit(":", 1)[1]
        cluster.wait_for(lambda: curl(f"https://localhost:{port}/v1/models", "--cacert",
                                      os.path.join(args.work, "b/ca.pem")).returncode == 0, 30,
                         "the HTTP door to serve CA b's certificate")
        results = [f.result() for f in futures]
    failed = [r for r in results if r[1] is not None or r[0] != tokens]
    assert not failed, failed
    assert rotated_while > 0, "every stream ended before the rotation took effect"
    # Internal connections made after the rotation use it too: a new decode worker joins.
    late = cluster.Process(args.tandem, "decode", c.worker_args + tls_args("decode"), c.log_dir)
    c.all.append(late)
    cluster.wait_for(lambda: c.router.metric("tandem_workers", {"pool": "decode"}) == 2, 30,
                     "a decode worker started after the rotation to register")
    print(f"rotation: {n}/{n} streams completed ({rotated_while} still running when the new "
          "certificate was served); CA-b-only client and a new worker got in")


def check_fail_closed():
    out = subprocess.run([args.tandem, "cache-store", "--listen", "0.0.0.0:0",
                          "--metrics-listen", ""], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0, out
    assert "security.allow_insecure" in out.stderr and "security.tls" in out.stderr, out.stderr
    proc = subprocess.Popen([args.tandem, "cache-store", "--listen", "0.0.0.0:0",
                             "--metrics-listen", "", "--set", "security.allow_insecure=true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving on 0.0.0.0:" in line, line
    finally:
        proc.terminate()
        err = proc.communicate(timeout=60)[1]
    assert "beyond loopback without TLS" in err, err
    print("fail closed: 0.0.0.0 without TLS refused; with allow_insecure it starts and warns")


def main():
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    certs("a")
    certs("b")
    certs("a", "--cert", "expired", "--uri", "spiffe://tandem/prefill", "--expired")
    install("a", read("a", "ca.pem"))
    check_fail_closed()
    check_serve_tls()
    c = cluster.Cluster(args.tandem, args.model, shards=1, prefill=1, decode=1, register=True,
                        role_args=tls_args, router_extra=["--http-listen", "127.0.0.1:0"])
    passed = False
    try:
        assert len(generate(c.router.address, "a/ca.pem")) == 8
        out = subprocess.run([args.tandem, "generate", "--addr", c.router.address, "--ca-file",
                              os.path.join(args.work, "a/ca.pem"), "--prompt", "def add(a, b):",
                              "--max-tokens", "8"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "generate: finish" in out.stderr, out
        print("served over mutual TLS: python grpcio and tandem generate --ca-file")
        # The Kubernetes probe: `tandem health` with the role's own certificate.
        health = subprocess.run([args.tandem, "health", "--addr", c.shards[0].address, "--service",
                                 "tandem.v1.CacheStore"] + tls_args("cache-store"),
                                capture_output=True, text=True, timeout=60)
        assert health.returncode == 0 and health.stdout.strip() == "SERVING", health
        plain = subprocess.run([args.tandem, "health", "--addr", c.shards[0].address],
                               capture_output=True, text=True, timeout=60)
        assert plain.returncode != 0, plain  # a TLS port does not answer plaintext
        print("tandem health: SERVING over TLS with the store's certificate; refused in plaintext")
        check_https(c)
        check_refusals(c)
        check_silent_clients(c)
        check_foreign_worker(c)
        assert len(generate(c.router.address, "a/ca.pem")) == 8  # still serving
        check_rotation(c)
        assert len(generate(c.router.address, "b/ca.pem")) == 8
        passed = True
    except Exception:
        print(c.logs(), file=sys.stderr)
        raise
    finally:
        c.stop(keep_logs=not passed)
    print("PASS")


main()
