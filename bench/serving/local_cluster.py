"""Tandem roles as separate processes on loopback, pinned as the serving benchmarks pin them.

  disaggregated  1 prefill worker on core 0 and 1 decode worker on core 1 (one compute thread
                 each), one cache-store shard, the router (shard and router unpinned);
  colocated      2 decode workers in router.mode=colocated, one per core (one thread each).

Used by disagg_vs_colocated.py and validate_planner.py.
"""
import json
import os
import re
import subprocess


class LocalCluster:
    def __init__(self, tandem, model, logs, extra=()):
        self.tandem, self.model, self.logs, self.extra = tandem, model, logs, list(extra)
        self.procs = []
        self.metrics = {}  # role -> its /metrics URL (the last one started of the role)

    def start(self, role, cores, extra):
        log = open(os.path.join(self.logs, f"{role}-{len(self.procs)}.log"), "w")
        cmd = (["taskset", "-c", cores] if cores else []) + [
            self.tandem, role, "--model", self.model, "--listen", "127.0.0.1:0",
            "--metrics-listen", "127.0.0.1:0", "--set", "model.threads=1"] + self.extra + extra
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        line = proc.stdout.readline()
        m = re.search(r"serving on ([^;\s]+)", line)
        if not m:
            raise RuntimeError(f"{role} did not start: {line!r} (log in {self.logs})")
        self.procs.append(proc)
        metrics = re.search(r"metrics (http://\S+?)[;\s]", line + " ")
        if metrics:
            self.metrics[role] = metrics.group(1)
        return m.group(1)

    def up(self, mode):
        """Starts the roles of `mode`; returns the router's address."""
        if mode == "disaggregated":
            shard = self.start("cache-store", None, [])
            store = ["--set", f"cache_store.shards=[{shard}]"]
            prefill = self.start("prefill", "0", store)
            decode = self.start("decode", "1", store)
            return self.start("router", None, ["--set", f"router.prefill_workers=[{prefill}]",
                                               "--set", f"router.decode_workers=[{decode}]"])
        decodes = [self.start("decode", str(core), []) for core in (0, 1)]
        return self.start("router", None, ["--set", "router.mode=colocated",
                                           "--set", f"router.decode_workers=[{','.join(decodes)}]"])

    def down(self):
        for proc in reversed(self.procs):
            proc.terminate()
            proc.wait()
        self.procs.clear()


def bench(tandem, addr, rate, workload, out_json):
    """One `tandem bench` run of `workload` (a dict of its flags without dashes) at `rate`."""
    flags = []
    for key, value in workload.items():
        flags += ["--" + key.replace("_", "-"), str(value)]
    subprocess.run([tandem, "bench", "--addr", addr, "--request-rate", str(rate),
                    "--json-out", out_json, "--progress=false"] + flags,
                   check=True, stdout=subprocess.DEVNULL)
    with open(out_json) as f:
        return json.load(f)
