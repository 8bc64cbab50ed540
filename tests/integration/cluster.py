"""Multi-process Tandem clusters on loopback for the integration tests.

Every role runs as its own `tandem <role>` process on an ephemeral port; the tests talk to the
router with Python's grpcio (a client Tandem did not write), with stubs generated from
proto/ by grpc_tools at test time. Nothing here sleeps to wait for an event: readiness is the
role's own "serving on" line, and conditions are polled with a deadline.
"""
import atexit
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77


def import_grpc(proto_dir):
    """Generates the tandem.v1 Python stubs into a temp dir and imports them."""
    try:
        import grpc  # noqa: F401
        from grpc_tools import protoc
    except ImportError as e:
        print(f"skipped: {e} (install python3-grpcio python3-grpc-tools)")
        sys.exit(SKIP)
    out = tempfile.mkdtemp(prefix="tandem_stubs_")
    atexit.register(shutil.rmtree, out, True)  # ignore_errors: gone already is fine
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    # Tandem's protos, plus grpc.health.v1 and reflection, which Debian ships no stubs for
    # (messages only: their package name "grpc" would shadow grpcio's, so they are loaded by
    # path and called through generic stubs).
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "protos")
    for root, stubs in ((proto_dir, True), (here, False)):
        protos = [os.path.join(d, f) for d, _, files in os.walk(root) for f in sorted(files)
                  if f.endswith(".proto")]
        rc = protoc.main(["protoc", f"-I{root}", f"-I{include}", f"--python_out={out}"] +
                         ([f"--grpc_python_out={out}"] if stubs else []) + protos)
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed on {root}")
    global _stubs_dir
    _stubs_dir = out
    sys.path.insert(0, out)
    import grpc
    from tandem.v1 import inference_pb2, inference_pb2_grpc
    return grpc, inference_pb2, inference_pb2_grpc


_stubs_dir = None


def _load(relative, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(_stubs_dir, relative))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def health_status(channel, service=""):
    """grpc.health.v1.Health/Check: "SERVING", "NOT_SERVING", ..."""
    pb = _load("grpc/health/v1/health_pb2.py", "tandem_test_health_pb2")
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=pb.HealthCheckRequest.SerializeToString,
                                response_deserializer=pb.HealthCheckResponse.FromString)
    status = check(pb.HealthCheckRequest(service=service), timeout=10).status
    return pb.HealthCheckResponse.ServingStatus.Name(status)


def reflected_services(channel):
    """Service names listed by server reflection."""
    pb = _load("grpc/reflection/v1alpha/reflection_pb2.py", "tandem_test_reflection_pb2")
    info = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=pb.ServerReflectionRequest.SerializeToString,
        response_deserializer=pb.ServerReflectionResponse.FromString)
    responses = info(iter([pb.ServerReflectionRequest(list_services="")]), timeout=10)
    return [s.name for r in responses for s in r.list_services_response.service]


def wait_for(predicate, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    if not predicate():
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def metric_value(url, name, labels=None):
    """The value of one sample `name` (with `labels` among its labels) at a /metrics URL; None
    when absent."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        m = re.match(r"([a-z_]+)(\{[^}]*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in (labels or {}).items()):
            return float(m.group(3))
    return None


class Process:
    """One role process; `address` and `metrics_url` come from its startup line."""

    def __init__(self, tandem, role, args, log_dir, listen="127.0.0.1:0"):
        self.role = role
        self.log = open(os.path.join(log_dir, f"{role}-{id(self)}.log"), "w+")
        self.proc = subprocess.Popen(
            [tandem, role, "--listen", listen, "--metrics-listen", "127.0.0.1:0"] + args,
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"serving on (\S+); metrics (\S+)", line)
        if not m:
            self.log.seek(0)
            raise RuntimeError(f"{role} did not start: {line!r} {self.log.read()}")
        self.address, self.metrics_url = m.group(1).rstrip(";"), m.group(2).rstrip(";")
        h = re.search(r"; http (\S+)", line)
        self.http_address = h.group(1) if h else None

    def metric(self, name, labels=None):
        """The value of one sample on this process's /metrics (None when absent)."""
        return metric_value(self.metrics_url, name, labels)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Cluster:
    """store shards, prefill and decode workers and a router, each its own process."""

    def __init__(self, tandem, model, shards=2, prefill=2, decode=2, store_bytes=None,
                 extra=(), router_extra=(), register=False, advertise=None, role_args=None,
                 shard_extra=()):
        """With `register`, the router starts first and the workers join it through the
        registry (heartbeats every 0.2 s), advertising `advertise` if given (a host alone, as a
        pod IP on Kubernetes: the worker adds its port); otherwise the router gets static
        worker lists. `role_args(role)` adds flags of one role (its certificate)."""
        self.role_args = role_args or (lambda role: [])
        self.log_dir = tempfile.mkdtemp(prefix="tandem_cluster_")
        common = ["--model", model, "--set", "model.threads=1"] + list(extra)
        self.all = []
        store = [] if store_bytes is None else ["--set", f"cache_store.capacity_bytes={store_bytes}"]
        try:
            self.shard_args = common + store + list(shard_extra)
            self.shards = [self._start(tandem, "cache-store", self.shard_args)
                           for _ in range(shards)]
            shard_list = "cache_store.shards=[" + ",".join(s.address for s in self.shards) + "]"
            worker = common + ["--set", shard_list]
            if register:
                self.router = self._start(tandem, "router", common + list(router_extra) + [
                    "--set", "router.heartbeat_interval_seconds=0.2"])
                worker += ["--set", f"prefill.router={self.router.address}",
                           "--set", f"decode.router={self.router.address}"]
                if advertise:
                    worker += ["--set", f"prefill.advertise={advertise}",
                               "--set", f"decode.advertise={advertise}"]
            self.worker_args = worker
            self.prefills = [self._start(tandem, "prefill", worker) for _ in range(prefill)]
            self.decodes = [self._start(tandem, "decode", worker) for _ in range(decode)]
            if register:
                wait_for(lambda: self.router.metric("tandem_workers", {"pool": "prefill"}) == prefill
                         and self.router.metric("tandem_workers", {"pool": "decode"}) == decode,
                         30, "every worker to register")
            else:
                self.router = self._start(tandem, "router", common + list(router_extra) + [
                    "--set", "router.prefill_workers=[" +
                    ",".join(p.address for p in self.prefills) + "]",
                    "--set", "router.decode_workers=[" +
                    ",".join(d.address for d in self.decodes) + "]"])
        except Exception:
            self.stop()
            raise

    def _start(self, tandem, role, args):
        p = Process(tandem, role, args + self.role_args(role), self.log_dir)
        self.all.append(p)
        return p

    def logs(self):
        out = []
        for p in self.all:
            with open(p.log.name) as f:
                out.append(f"--- {p.role} ---\n{f.read()[-3000:]}")
        return "\n".join(out)

    def stop(self, keep_logs=False):
        """Stops every process; removes their logs unless `keep_logs` (a failed test's)."""
        for p in reversed(self.all):
            p.stop()
        if keep_logs:
            print(f"logs kept in {self.log_dir}")
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)


def expected_greedy(model_inspect, model, ids, max_tokens, extra=()):
    """model-inspect generate on the same model: the reference token ids."""
    out = subprocess.run(
        [model_inspect, "generate", "--model", model, "--tokens", ",".join(map(str, ids)),
         "--max-tokens", str(max_tokens), "--ignore-eos", "--threads", "1"] + list(extra),
        check=True, capture_output=True, text=True).stdout
    return [int(t) for t in out.splitlines()[0].split(",")]
