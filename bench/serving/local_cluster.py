"""Tandem roles as separate processes on loopback, pinned as the serving benchmarks pin them.

  disaggregated  1 prefill worker on core 0 and 1 decode worker on core 1 (one compute thread
                 each), one cache-store shard, the router (shard and router unpinned);
  colocated      2 decode workers in router.mode=colocated, one per core (one thread each).
  colocated-2t   1 decode worker in router.mode=colocated on both cores (two threads).

Used by disagg_vs_colocated.py, validate_planner.py and cpu_share.py, which share the
workloads below.
"""
import glob
import json
import os
import resource
import re
import subprocess
import time
import urllib.request


# name: (model, profile, rates, tandem bench flags). Lengths are uniform in len * (1 ± range).
WORKLOADS = {
    # The serving benchmark's: the bundled model, short prompts, long outputs.
    "decode-heavy": ("models/tandem-py-8l", "bench/profiles/tandem-py-8l-1t.json", "4,8,16,24",
                     {"input_len": 512, "input_len_range": 0.5, "output_len": 128,
                      "output_len_range": 0.5, "slo_ttft_ms": 250, "slo_tpot_ms": 10}),
    # 125M shape, prompts 1,024-2,048 tokens, outputs 32-128: colocated chunked prefill stalls
    # the decodes that share its steps.
    "prefill-heavy": ("/tmp/m125", "bench/profiles/125m-bf16-1t.json", "0.25,0.4,0.55,0.7",
                      {"input_len": 1536, "input_len_range": 0.33, "output_len": 80,
                       "output_len_range": 0.6, "slo_ttft_ms": 8000, "slo_tpot_ms": 25}),
    # The same on a CPU without bf16 dot products (AVX2 only, e.g. Zen 3), where a 1,536-token
    # prompt takes ~4 s on one core: the TTFT bound 3x that, the rates below one prefill core's.
    "prefill-heavy-avx2": ("/tmp/m125", "bench/profiles/125m-bf16-1t-zen3.json",
                           "0.06,0.09,0.12,0.15",
                           {"input_len": 1536, "input_len_range": 0.33, "output_len": 80,
                            "output_len_range": 0.6, "slo_ttft_ms": 12000, "slo_tpot_ms": 25}),
    # The mixed workload on such a CPU: the TTFT bound 3 s (a 384-token prefill takes ~0.8 s).
    "mixed-avx2": ("/tmp/m125", "bench/profiles/125m-bf16-1t-zen3.json", "0.5,1,1.5,2",
                   {"input_len": 384, "input_len_range": 0.5, "output_len": 128,
                    "output_len_range": 0.5, "slo_ttft_ms": 3000, "slo_tpot_ms": 50}),
    # 125M shape, prompts and outputs of similar size.
    "mixed": ("/tmp/m125", "bench/profiles/125m-bf16-1t.json", "0.5,1,2,3",
              {"input_len": 384, "input_len_range": 0.5, "output_len": 128,
               "output_len_range": 0.5, "slo_ttft_ms": 1000, "slo_tpot_ms": 50}),
    # A bursty trace (bench/serving/make_bursty_trace.py: Mooncake's format, non-Poisson send
    # times, prompts 128-1,024 tokens, outputs 32-256), replayed scaled to each mean rate.
    "trace": ("models/tandem-py-8l", "bench/profiles/tandem-py-8l-1t.json", "4,8,16",
              {"dataset": "bench/traces/bursty-120.jsonl", "slo_ttft_ms": 250,
               "slo_tpot_ms": 10}),
}
DEPLOYMENTS = {"colocated": "colocated:2", "disaggregated": "disaggregated:1:1",
               # One colocated worker computing on both cores (model.threads=2), simulated on
               # the workload's two-thread profile (profile_for).
               "colocated-2t": "colocated:1"}


def profile_for(mode, profile):
    """The engine profile a deployment is simulated with: the two-thread one of the workload's
    model for a deployment whose workers compute on two threads."""
    return profile.replace("-1t", "-2t") if mode.endswith("-2t") else profile


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

    def up(self, mode, router_extra=()):
        """Starts the roles of `mode` (`router_extra`: more flags for the router alone);
        returns the router's address."""
        router_extra = list(router_extra)
        if mode == "disaggregated":
            shard = self.start("cache-store", None, [])
            store = ["--set", f"cache_store.shards=[{shard}]"]
            prefill = self.start("prefill", "0", store)
            decode = self.start("decode", "1", store)
            return self.start("router", None, ["--set", f"router.prefill_workers=[{prefill}]",
                                               "--set", f"router.decode_workers=[{decode}]"]
                              + router_extra)
        if mode == "colocated-2t":
            decodes = [self.start("decode", "0,1", ["--set", "model.threads=2"])]
        else:
            decodes = [self.start("decode", str(core), []) for core in (0, 1)]
        return self.start("router", None, ["--set", "router.mode=colocated",
                                           "--set", f"router.decode_workers=[{','.join(decodes)}]"]
                          + router_extra)

    def down(self):
        for proc in reversed(self.procs):
            proc.terminate()
            proc.wait()
        self.procs.clear()


def scrape(url):
    """The samples at a /metrics `url`: a list of (name, labels dict, value)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    samples = []
    for line in text.splitlines():
        m = re.match(r"(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m:
            samples.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")),
                            float(m.group(3))))
    return samples


def _matching(samples, name, labels):
    for sample_name, series, value in samples:
        if sample_name == name and all(series.get(k) == v for k, v in labels.items()):
            yield series, value


def counter(samples, name, labels):
    """The sum of counter (or gauge) `name` over the series whose labels include `labels`."""
    return sum(value for _, value in _matching(samples, name, labels))


def histogram(samples, name, labels):
    """{"sum", "count", "buckets": [(le, cumulative count)]} of histogram `name`, summed over the
    series whose labels include `labels`."""
    buckets = {}
    for series, value in _matching(samples, name + "_bucket", labels):
        le = float(series["le"])
        buckets[le] = buckets.get(le, 0.0) + value
    return {"sum": counter(samples, name + "_sum", labels),
            "count": counter(samples, name + "_count", labels),
            "buckets": sorted(buckets.items())}


def histogram_delta(before, after):
    """What a histogram gained between two scrape_histogram results."""
    return {"sum": after["sum"] - before["sum"], "count": after["count"] - before["count"],
            "buckets": [(le, c - b) for (le, c), (_, b) in zip(after["buckets"],
                                                                 before["buckets"])]}


def histogram_quantile(h, q):
    """The bucket bound below which a share `q` of the observations in `h` fell (an upper
    bound, as Prometheus' histogram_quantile without its interpolation)."""
    if h["count"] <= 0:
        return float("nan")
    for le, c in h["buckets"]:
        if c >= q * h["count"]:
            return le
    return float("inf")


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


def threads(pid):
    """tid -> (cpu seconds, run delay seconds, last cpu) of every thread of `pid`."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(task + "/schedstat") as f:
                run_ns, wait_ns, _ = (int(v) for v in f.read().split())
            with open(task + "/stat") as f:
                cpu = int(f.read().rsplit(")", 1)[1].split()[36])
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(os.path.basename(task))] = (run_ns * 1e-9, wait_ns * 1e-9, cpu)
    return out


def delta(before, after):
    return {tid: (a[0] - before.get(tid, (0, 0, 0))[0], a[1] - before.get(tid, (0, 0, 0))[1])
            for tid, a in after.items()}


ITL = "tandem_inter_token_latency_seconds"


def scrape_roles(cluster):
    """role -> its /metrics samples (for the last process started of each role)."""
    return {role: scrape(url) for role, url in cluster.metrics.items()}


def engine_loop(before, after, role, wall):
    """What the worker's engine loop did over a run: steps, mean batch, mean step wall and CPU
    ms, and each part's share of the wall time."""
    def gained(name, **labels):
        labels["role"] = role
        return counter(after[role], name, labels) - counter(before[role], name, labels)
    steps = gained("tandem_engine_steps_total")
    out = {"steps": steps,
           "mean_batch": gained("tandem_engine_step_sequences_total") / max(steps, 1),
           "step_ms": 1e3 * gained("tandem_engine_loop_seconds_total", part="step") / max(steps, 1),
           "step_cpu_ms": 1e3 * gained("tandem_engine_step_cpu_seconds_total") / max(steps, 1)}
    for part in ("step", "tasks", "outputs"):
        out[part + "_share"] = gained("tandem_engine_loop_seconds_total", part=part) / wall
    return out


def cpu_of_run(cluster, run):
    """Calls `run` (a `tandem bench` run in a child process) and returns (what it returned,
    wall seconds, CPU seconds per role summed over its processes with the bench client's as
    "bench", and each worker role's engine_loop over the run)."""
    pids = {proc.pid: proc.args[proc.args.index(cluster.tandem) + 1] for proc in cluster.procs}
    before = {pid: threads(pid) for pid in pids}
    scraped = scrape_roles(cluster)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    out = run()
    wall = time.monotonic() - start
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    scraped_after = scrape_roles(cluster)
    cpu = {"bench": after_children.ru_utime + after_children.ru_stime
           - children.ru_utime - children.ru_stime}
    for pid, role in pids.items():
        cpu[role] = cpu.get(role, 0) + sum(v[0] for v in delta(before[pid], threads(pid)).values())
    loops = {role: engine_loop(scraped, scraped_after, role, wall)
             for role in ("prefill", "decode") if role in scraped_after}
    return out, wall, cpu, loops
