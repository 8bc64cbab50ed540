#!/usr/bin/env python3
"""Integration tests of the disaggregated path: every role its own process on loopback, driven
through the public API by Python's grpcio.

  --case greedy     100 concurrent requests of mixed lengths, 1 router + 2 prefill + 2 decode +
                    2 store shards: each stream equals `model-inspect generate` token for token.
  --case faults     kill -9 of a decode worker, a prefill worker and a store shard under load:
                    every request completes with the greedy output; block counts return to 0.
  --case hang       SIGSTOP of a decode worker mid-stream (alive to TCP, silent to gRPC): the
                    router's keepalive pings find it within seconds, its streams are migrated
                    and complete with the greedy output; it leaves rotation. Resumed, it frees
                    every block and rejoins.
  --case balancer   a store too small for the load: the decode hit rate falls below 90%, the
                    balancer engages (router /metrics), nothing fails; light load brings the
                    hit rate back above 90% and the balancer back to normal.
  --case serve      `tandem serve`, colocated (its default on one CPU) and disaggregated:
                    `tandem generate` and 12 concurrent streams give the same ids and text as
                    `model-inspect generate`, one /metrics for every role, clean exit on SIGTERM.
  --case pruning    prefill workers prune (POP), decode workers run the full model on the KV
                    they receive: every stream equals `model-inspect generate` with the same
                    pruning flags, and pruning changes some outputs
  --case mixed      kv_cache.dtype mixed on every role: blocks behind the window cross the
                    store as int8 (half the bytes) and the streams agree with
                    `model-inspect generate --kv-dtype mixed`
  --case loading    while a role loads its model (config.json a named pipe the test fills
                    later), its port answers grpc.health.v1 NOT_SERVING, overall and for its
                    service; once loaded, SERVING on the same port; `tandem serve` likewise.
                    SIGTERM while loading stops the process at once.
  --case shard_label  a store shard listening on 0.0.0.0 labels its metrics host:port.
  --case disk       a store shard with a disk tier and 2 MiB of memory: prompts needing 6x its
                    memory are served again with their blocks read back from disk (decode hit
                    rate >= 90%, greedy output); kill -9 of the shard under load (every request
                    completes) and a restart on the same address and directory: the blocks it
                    recovered are hits again.
  --case fabric     cache_store.transport=ucx on every role (UCX_TLS from the environment:
                    tcp, or sm between processes), the shards with cache_store.shared_memory
                    false as on Kubernetes: 40 concurrent requests equal
                    `model-inspect generate`, their blocks crossed UCX (the workers' transport
                    metrics), none the gRPC stream; kill -9 of a shard during transfers: every
                    request completes with the greedy output.
  --case preallocate  cache_store.preallocate on a 64 MiB shard: the shard holds the whole
                    arena before it serves and says so when attached to (with the lease time
                    of cache_store.lease_seconds), each worker attaches as it starts and maps
                    all of it before any request, and requests over shared memory equal
                    `model-inspect generate`.
  --case api        bad input is INVALID_ARGUMENT with a message (invalid UTF-8 included);
                    GetModelInfo; client cancel frees the blocks; after SIGTERM new requests
                    are UNAVAILABLE while the one in flight completes.
"""
import argparse
import concurrent.futures
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import cluster

p = argparse.ArgumentParser()
p.add_argument("--case", required=True)
p.add_argument("--tandem", required=True)
p.add_argument("--model-inspect", required=True)
p.add_argument("--model", required=True)
p.add_argument("--proto-dir", required=True)
args = p.parse_args()
grpc, pb, pb_grpc = cluster.import_grpc(args.proto_dir)
VOCAB = 4096


def request(ids, max_tokens, **sampling):
    return pb.GenerateRequest(prompt_token_ids=ids, sampling=pb.SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, **sampling))


def stream(stub, req, timeout=300, on_chunk=None):
    """(token ids, Complete or None, grpc code, details) of one Generate call."""
    ids, complete = [], None
    call = stub.Generate(req, timeout=timeout)
    try:
        for msg in call:
            if msg.HasField("chunk"):
                ids.extend(msg.chunk.token_ids)
                if on_chunk:
                    on_chunk(call, len(ids))
            else:
                complete = msg.complete
        return ids, complete, grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return ids, complete, e.code(), e.details()


def random_requests(n, seed, max_prompt, max_out):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.choice([rng.randint(1, 15), rng.randint(16, 64), rng.randint(65, max_prompt)])
        out.append(([rng.randrange(VOCAB) for _ in range(length)], rng.randint(1, max_out)))
    return out


def expected(reqs, extra=()):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda r: cluster.expected_greedy(
            args.model_inspect, args.model, r[0], r[1], extra), reqs))


def run_concurrently(stub, reqs, on_chunk=None):
    with concurrent.futures.ThreadPoolExecutor(len(reqs)) as pool:
        return list(pool.map(lambda r: stream(stub, request(*r), on_chunk=on_chunk), reqs))


def after_streams(threshold, action):
    """(on_chunk, thread, done): the thread runs `action` once `threshold` streams have sent a
    chunk, then sets `done`; join it after the requests."""
    started, done = threading.Event(), threading.Event()
    streaming = set()
    lock = threading.Lock()

    def on_chunk(call, tokens):
        with lock:
            streaming.add(id(call))
            if len(streaming) >= threshold:
                started.set()

    def run():
        if started.wait(120):
            action()
            done.set()
    t = threading.Thread(target=run)
    t.start()
    return on_chunk, t, done


def check_greedy(results, reqs, want, what):
    bad = 0
    for i, ((ids, complete, code, details), (prompt, max_tokens)) in enumerate(zip(results, reqs)):
        if code != grpc.StatusCode.OK:
            print(f"{what} request {i}: {code} {details}")
            bad += 1
        elif ids != want[i] or complete is None or complete.usage.completion_tokens != max_tokens:
            print(f"{what} request {i}: prompt {len(prompt)} tokens, got {ids[:8]}... "
                  f"want {want[i][:8]}... ({len(ids)} vs {len(want[i])})")
            bad += 1
    print(f"{what}: {len(reqs) - bad}/{len(reqs)} equal to model-inspect generate")
    assert bad == 0, f"{what}: {bad} requests differ or failed"


def wait_blocks_free(c, timeout=5):
    """Every engine's used KV blocks back to 0 and the router idle (metrics refresh: 0.5 s)."""
    def idle():
        for w in c.prefills + c.decodes:
            if w.proc.poll() is None and w.metric("tandem_kv_cache_usage_ratio") not in (0.0, None):
                return False
        r = c.router
        return (r.metric("tandem_requests_running", {"role": "router"}) == 0 and
                r.metric("tandem_requests_waiting", {"role": "router"}) == 0)
    cluster.wait_for(idle, timeout, "every KV block to be freed")


def case_greedy(c, stub):
    reqs = random_requests(100, seed=1, max_prompt=300, max_out=40)
    want = expected(reqs)
    t0 = time.monotonic()
    results = run_concurrently(stub, reqs)
    print(f"100 concurrent requests in {time.monotonic() - t0:.1f} s")
    check_greedy(results, reqs, want, "greedy")
    wait_blocks_free(c)
    # Each shard's /metrics (refreshed every 0.5 s): blocks stored by prefill and read back by
    # decode, none pinned once the last leases are released.
    for s in c.shards:
        cluster.wait_for(lambda: s.metric("tandem_cache_store_pinned_blocks") == 0, 10,
                         "the shard's pins to be released")
        got = {k: s.metric(name, labels) for k, name, labels in [
            ("blocks", "tandem_cache_store_blocks", None),
            ("stored", "tandem_cache_store_puts_total", {"outcome": "stored"}),
            ("hits", "tandem_cache_store_lookups_total", {"result": "hit"}),
            ("pinned", "tandem_cache_store_pinned_blocks", None),
            ("used", "tandem_cache_store_used_bytes", None)]}
        print(f"  shard {s.address}: {got}")
        assert got["blocks"] > 0 and got["stored"] >= got["blocks"] and got["hits"] > 0, got
        assert got["pinned"] == 0 and got["used"] > 0, got
    # Each worker times its side of the handoff: prefill's uploads, decode's fetches.
    for w in c.prefills + c.decodes:
        n = w.metric("tandem_kv_transfer_seconds_count", {"role": w.role})
        print(f"  {w.role} {w.address}: {n:.0f} KV transfers timed")
        assert n > 0, (w.role, n)
    # Each worker says which GEMMs it runs: what `model-inspect info` says model.cpu_gemm: auto
    # picks on this CPU, and the ISA oneDNN reports.
    info = subprocess.run([args.model_inspect, "info", "--model", args.model],
                          capture_output=True, text=True, check=True).stdout
    provider = re.search(r"^cpu gemm: (\w+)", info, re.M).group(1)
    for w in c.prefills + c.decodes:
        assert w.metric("tandem_cpu_gemm_info", {"role": w.role, "provider": provider}) == 1, \
            (w.role, provider)
    # A decode worker whose KV cache differs from the cluster's (int8) is refused when it
    # registers, with both layouts named in its log, and never enters rotation.
    odd = c._start(args.tandem, "decode", c.worker_args + ["--set", "kv_cache.dtype=int8"])

    def odd_log():
        with open(odd.log.name) as f:
            return f.read()
    cluster.wait_for(lambda: "KV cache mismatch" in odd_log(), 30, "the int8 worker's refusal")
    assert "the worker holds int8 blocks of 16 tokens" in odd_log(), odd_log()
    assert c.router.metric("tandem_workers", {"pool": "decode"}) == 2
    # Not ready (its service NOT_SERVING, as a readiness probe sees it), yet alive ("").
    with grpc.insecure_channel(odd.address) as channel:
        assert cluster.health_status(channel, "tandem.v1.DecodeWorker") == "NOT_SERVING"
        assert cluster.health_status(channel) == "SERVING"
    odd.stop()


# Prefill-only pruning on the prefill workers: the last 3 of the bundled model's 8 layers, the
# positions of each prompt's 4 most frequent ids protected, every batch pruned.
PRUNING = {"start_layer": 5, "protect": 4}
PRUNING_CONFIG = ["--set", "kv_cache_optimization.enabled=true",
                  "--set", f"kv_cache_optimization.pruning.start_layer={PRUNING['start_layer']}",
                  "--set", "kv_cache_optimization.protection.high_frequency_tokens="
                  f"{PRUNING['protect']}",
                  "--set", "kv_cache_optimization.min_batch_size=1",
                  # The attention-stability monitor checks every 5th prefilled prompt.
                  "--set", "kv_cache_optimization.monitor.sample_rate=0.2"]


def case_pruning(c, stub):
    """The prefill workers prune, the decode workers run the full model on the KV they receive
    (keyed by the handle's cache salt): every stream equals `model-inspect generate` with the
    same pruning, and pruning visibly changes the output.

    Only full blocks travel: decode recomputes the prompt's last partial block, at full depth,
    where a single engine pruned it. Prompts of 16k + 1 tokens make that block the last prompt
    token alone, which runs at full depth either way, so the outputs must match exactly."""
    reqs = [([t for t in prompt + prompt][:16 * (len(prompt) // 16) + 1], n)
            for prompt, n in random_requests(30, seed=3, max_prompt=300, max_out=24)]
    want = expected(reqs, ["--prune-start-layer", str(PRUNING["start_layer"]),
                           "--protect-tokens", str(PRUNING["protect"])])
    unpruned = expected(reqs)
    results = run_concurrently(stub, reqs)
    check_greedy(results, reqs, want, "pruned greedy")
    changed = sum(w != u for w, u in zip(want, unpruned))
    print(f"pruning changed the output of {changed}/{len(reqs)} requests")
    assert changed > 0, "pruning changed nothing: is it applied?"
    # Layers 5, 6 and 7 of 8 on each prefill worker's /metrics; decode prunes none.
    for w in c.prefills + c.decodes:
        layers = w.metric("tandem_pruned_layers", {"role": w.role})
        print(f"  {w.role} {w.address}: tandem_pruned_layers {layers}")
        assert layers == (3 if w.role == "prefill" else 0), (w.role, layers)
    # The stability monitor's checks (every 5th prompt a worker prefills), and a similarity for
    # each pruned layer where it checked one.
    def checks_of(w):
        return sum(w.metric("tandem_pruning_stability_checks_total",
                            {"role": "prefill", "result": r}) or 0 for r in ("ok", "alert"))

    # A worker's last check may still be running after the last response: let the counts settle.
    deadline = time.time() + 10
    while time.time() < deadline and \
            sum(map(checks_of, c.prefills)) < len(reqs) // 5 - len(c.prefills):
        time.sleep(0.2)
    total = 0
    for w in c.prefills:
        checks = checks_of(w)
        cosines = [w.metric("tandem_pruning_attention_cosine",
                            {"role": "prefill", "layer": str(layer)}) for layer in (5, 6, 7)]
        print(f"  prefill {w.address}: {checks:.0f} stability checks, last cosines {cosines}")
        total += checks
        if checks:
            assert all(v is not None and -1 <= v <= 1 for v in cosines), cosines
            assert abs(cosines[0] - 1) < 1e-4, cosines  # layer 5 sees what full prefill sees
    assert total >= len(reqs) // 5 - len(c.prefills), total
    wait_blocks_free(c)


# A mixed-precision KV cache on every role: fp16 for the sink block and the last 32 tokens, int8
# behind them.
MIXED_CONFIG = ["--set", "kv_cache.dtype=mixed", "--set", "kv_cache.mixed.window_tokens=32"]


def case_mixed(c, stub):
    """Prefill hands decode each block in its own dtype, through the store. Decode recomputes a
    prompt's partial last block over int8 blocks where a single engine computed it over fp16
    ones, so the streams are compared with `model-inspect generate --kv-dtype mixed` by
    agreement, not equality."""
    rng = random.Random(5)
    reqs = [([rng.randrange(VOCAB) for _ in range(rng.randint(120, 300))], rng.randint(20, 40))
            for _ in range(24)]
    want = expected(reqs, ["--kv-dtype", "mixed", "--kv-window-tokens", "32"])
    results = run_concurrently(stub, reqs)
    same = total = 0
    for (ids, complete, code, details), (prompt, max_tokens), w in zip(results, reqs, want):
        assert code == grpc.StatusCode.OK, (code, details)
        assert complete is not None and complete.usage.completion_tokens == max_tokens
        same += sum(a == b for a, b in zip(ids, w))
        total += len(w)
    print(f"mixed KV: {same}/{total} tokens equal to model-inspect generate --kv-dtype mixed")
    assert same >= 0.95 * total, (same, total)
    # Most of each prompt is behind the window: the store holds mostly int8 blocks, which are
    # about half the size of fp16 ones (16 tokens x 2 x 8 layers x 2 heads x 64 bytes).
    fp16_block = 16 * 2 * 8 * 2 * 32 * 2
    # The shards' own stats, exact once every stream has ended (a prefill answers only after its
    # blocks are stored). Their /metrics lag by up to 0.5 s: read while one shard had refreshed
    # and the other not, they once gave a ratio past the bound below (the 20-run loop).
    wait_blocks_free(c)
    from tandem.v1 import cache_store_pb2, cache_store_pb2_grpc
    stats = [cache_store_pb2_grpc.CacheStoreStub(grpc.insecure_channel(s.address)).GetStats(
        cache_store_pb2.GetStatsRequest(), timeout=10) for s in c.shards]
    blocks = sum(st.blocks for st in stats)
    used = sum(st.used_bytes for st in stats)
    assert blocks > 0, stats
    print(f"  store: {blocks:.0f} blocks, {used / blocks:.0f} bytes each "
          f"(an fp16 block: {fp16_block})")
    assert used / blocks < 0.75 * fp16_block, (blocks, used)
    # Both roles requantize: prefill before it exports, decode as its sequences grow.
    def requantized(workers):
        return sum(w.metric("tandem_kv_cache_requantized_blocks_total", {"role": w.role}) or 0
                   for w in workers)
    for role, workers in (("prefill", c.prefills), ("decode", c.decodes)):
        cluster.wait_for(lambda: requantized(workers) > 0, 10,
                         f"the {role} workers to report requantized blocks")
        print(f"  {role}: {requantized(workers):.0f} blocks requantized to int8")


# The fault case streams 3 tokens per decode message (scheduler.stream_interval): tokens a
# killed decode worker had made but not yet sent are made again by the worker the stream moves
# to, and the answers still equal model-inspect's.
STREAM_IN_THREES = ["--set", "scheduler.stream_interval=3"]


def case_faults(c, stub):
    # Each victim dies once this many streams have started: decode workers mid-stream, prefill
    # workers and shards while most prompts are still being prefilled.
    waves = [("decode", c.decodes[0], 10), ("prefill", c.prefills[0], 1),
             ("store shard", c.shards[0], 1)]
    for n, (what, victim, threshold) in enumerate(waves):
        reqs = random_requests(30, seed=10 + n, max_prompt=200, max_out=120)
        want = expected(reqs)
        on_chunk, t, killed = after_streams(threshold, victim.kill9)
        results = run_concurrently(stub, reqs, on_chunk)
        t.join()
        assert killed.is_set(), f"the {what} was never killed"
        check_greedy(results, reqs, want, f"kill -9 {what}")
        with open(c.router.log.name) as f:
            moved = sum(1 for line in f if victim.address in line and "failed" in line)
        print(f"  router log: {moved} retries or migrations off {victim.address}")
        if what != "store shard":
            assert moved > 0, f"killing the {what} hit no request in flight"
        else:
            # Blocks stored before the kill and read after it are misses (recomputed); blocks
            # whose upload failed never enter a KV handle, so decode recomputes them unasked.
            misses = c.decodes[1].metric("tandem_kv_lookups_total",
                                         {"result": "miss", "role": "decode"})
            print(f"  decode misses so far: {misses}")
    # The surviving shard holds no pins or half-written blocks. A worker killed while it held a
    # shared-memory lease (a get between Acquire and its asynchronous Release, a put between
    # Reserve and Commit) never releases it: the shard reclaims it when the lease expires
    # (30 s, ShmLeases), so the wait covers one lease time.
    from tandem.v1 import cache_store_pb2, cache_store_pb2_grpc
    shard = cache_store_pb2_grpc.CacheStoreStub(grpc.insecure_channel(c.shards[1].address))
    cluster.wait_for(lambda: shard.GetStats(cache_store_pb2.GetStatsRequest(),
                                            timeout=10).pinned_blocks == 0, 40,
                     "the store's pins to be released")
    print(f"  surviving shard: {shard.GetStats(cache_store_pb2.GetStatsRequest(), timeout=10)}"
          .replace("\n", " "))
    # The dead workers left rotation after three missed heartbeats.
    cluster.wait_for(lambda: c.router.metric("tandem_workers", {"pool": "decode"}) == 1 and
                     c.router.metric("tandem_workers", {"pool": "prefill"}) == 1, 10,
                     "the killed workers to leave rotation")
    wait_blocks_free(c)


def case_hang(c, stub):
    reqs = random_requests(20, seed=30, max_prompt=200, max_out=120)
    want = expected(reqs)
    victim = c.decodes[0]
    stopped_at = []

    def stop():
        victim.proc.send_signal(signal.SIGSTOP)
        stopped_at.append(time.monotonic())
    on_chunk, t, _ = after_streams(6, stop)
    try:
        results = run_concurrently(stub, reqs, on_chunk)
        done_at = time.monotonic()
        t.join()
        assert stopped_at, "the decode worker was never stopped"
        check_greedy(results, reqs, want, "SIGSTOP decode")
        with open(c.router.log.name) as f:
            moved = sum(1 for line in f if victim.address in line and "migrating" in line)
        print(f"  {moved} streams migrated off the stopped worker; all done "
              f"{done_at - stopped_at[0]:.1f} s after the stop")
        assert moved > 0, "stopping the decode worker hit no stream in flight"
        # Pings every 1 s, 1 s to answer: well within the 300 s deadline of each stream.
        assert done_at - stopped_at[0] < 30, "the hung worker was not detected promptly"
        cluster.wait_for(lambda: c.router.metric("tandem_workers", {"pool": "decode"}) == 1, 10,
                         "the stopped worker to leave rotation")
        # Resumed, it finds its streams cancelled and frees their blocks, and registers again.
        victim.proc.send_signal(signal.SIGCONT)
        wait_blocks_free(c, timeout=15)
        cluster.wait_for(lambda: c.router.metric("tandem_workers", {"pool": "decode"}) == 2, 15,
                         "the resumed worker to rejoin")
    finally:
        victim.proc.send_signal(signal.SIGCONT)


def case_balancer(c, stub):
    r = c.router
    # Heavy: 24 prompts of 16 blocks at once into 2 x 1 MiB of store. Whether blocks are
    # evicted before decode reads them depends on how the two cores interleave prefill and
    # decode, so a round whose hit rate stays above 90% is followed by another, with new
    # prompts, up to three.
    for attempt in range(3):
        reqs = [([random.Random(1000 * attempt + i).randrange(VOCAB) for _ in range(256)], 8)
                for i in range(24)]
        results = run_concurrently(stub, reqs)
        assert all(code == grpc.StatusCode.OK for _, _, code, _ in results), \
            [d for _, _, code, d in results if code != grpc.StatusCode.OK]
        hit = r.metric("tandem_decode_kv_hit_ratio")
        state = r.metric("tandem_balancer_state")
        reschedules = r.metric("tandem_balancer_reschedules_total")
        print(f"heavy load, round {attempt + 1}: hit ratio {hit}, balancer state {state}, "
              f"reschedules {reschedules}")
        if hit is not None and hit < 0.9 and state == 1:
            break
    assert hit is not None and hit < 0.9 and state == 1, (hit, state)
    # Light: one 4-block prompt at a time; the store keeps up, the window fills with hits.
    rng = random.Random(5)
    end = time.monotonic() + 30
    n = 0
    while time.monotonic() < end:
        ids, _, code, details = stream(stub, request([rng.randrange(VOCAB) for _ in range(64)], 4))
        assert code == grpc.StatusCode.OK, details
        n += 1
        if r.metric("tandem_balancer_state") == 0:
            break
    hit = r.metric("tandem_decode_kv_hit_ratio")
    print(f"light load: {n} requests, hit ratio {hit}, balancer state "
          f"{r.metric('tandem_balancer_state')}")
    assert r.metric("tandem_balancer_state") == 0 and hit >= 0.9, hit


# Workers keep two prompts' prefixes of their own (1 MiB of KV: 32 blocks), so a prompt sent
# again after ten others is fetched from the store, by prefill (load_prefixes) as by decode.
LITTLE_LOCAL_KV = ["--set", "kv_cache.memory_bytes=1MiB", "--set", "cache_store.load_prefixes=true"]


def case_disk(c, stub):
    shard = c.shards[0]
    disk = {"tier": "disk"}
    # 24 prompts of 16 blocks (32 KiB each): 12 MiB of KV for 2 MiB of shard memory.
    reqs = [([random.Random(4000 + i).randrange(VOCAB) for _ in range(256)], 8) for i in range(24)]
    want = expected(reqs)
    # One at a time: the spill thread writes a prompt's blocks before the next ones evict them (concurrent puts faster than the disk lose
    # blocks instead: tandem_cache_store_disk_writes_total{outcome="evicted_first"}).
    writes = lambda outcome: shard.metric("tandem_cache_store_disk_writes_total",
                                          {"outcome": outcome})
    for i, r in enumerate(reqs):
        check_greedy(run_concurrently(stub, [r]), [r], [want[i]], f"first pass, prompt {i + 1}")
        cluster.wait_for(lambda: writes("written") >= 16 * (i + 1), 10,
                         f"prompt {i + 1}'s blocks to reach the disk")
    print(f"  disk: {shard.metric('tandem_cache_store_blocks', disk)} blocks, "
          f"{shard.metric('tandem_cache_store_used_bytes', disk)} bytes, "
          f"{writes('evicted_first')} evicted before written, {writes('written')} written of "
          f"{shard.metric('tandem_cache_store_puts_total', {'outcome': 'stored'})} stored, "
          f"{shard.metric('tandem_cache_store_puts_total', {'outcome': 'skipped'})} skipped; memory: "
          f"{shard.metric('tandem_cache_store_blocks', {'tier': 'memory'})} blocks")
    # The prefixes need 6x the shard's memory.
    assert shard.metric("tandem_cache_store_blocks", disk) == 24 * 16
    assert writes("evicted_first") == 0
    hits = lambda: shard.metric("tandem_cache_store_tier_lookups_total",
                                {"tier": "disk", "result": "hit"})
    before = hits()
    # Decode says which tier each hit came from, and the router adds them up.
    by_tier = lambda: {tier: c.router.metric("tandem_kv_lookups_total",
                                             {"role": "router", "result": "hit", "tier": tier}) or 0
                       for tier in ("worker", "memory", "disk")}
    tiers_before = by_tier()
    # One at a time again: each prompt's 16 blocks are promoted into memory and pinned while
    # prefill and decode copy them. Six at once pinned more than the shard's 2 MiB on a loaded
    # machine, and a prompt whose blocks found no room was (correctly) recomputed instead.
    again = [run_concurrently(stub, [r])[0] for r in reqs[:6]]
    check_greedy(again, reqs[:6], want[:6], "again, from disk")
    # Prefill imported the prompts' blocks from the store instead of computing them.
    cached = [complete.usage.cached_prompt_tokens for _, complete, _, _ in again]
    print(f"  prompt tokens prefill did not compute: {cached}")
    assert all(n >= 240 for n in cached), cached
    cluster.wait_for(lambda: hits() - before >= 6 * 16, 5, "every block of them from disk")
    hit_ratio = c.router.metric("tandem_decode_kv_hit_ratio")
    print(f"  disk hits {hits() - before}, decode hit ratio {hit_ratio}")
    assert hit_ratio is not None and hit_ratio >= 0.9, hit_ratio
    # Prefill read these prompts' blocks back from disk (load_prefixes), so decode found them in
    # the shard's memory: every one of its hits on them came from there.
    tiers = {t: n - tiers_before[t] for t, n in by_tier().items()}
    print(f"  decode hits by tier, as the router counts them: {tiers}")
    assert tiers["memory"] >= 6 * 15, tiers
    # kill -9 under load: every request completes (blocks recomputed where the shard is gone).
    load = random_requests(12, seed=41, max_prompt=200, max_out=60)
    on_chunk, t, killed = after_streams(2, shard.kill9)
    check_greedy(run_concurrently(stub, load, on_chunk), load, expected(load), "kill -9 shard")
    t.join()
    assert killed.is_set()
    # Restarted on the same address and directory, it serves what its disk holds.
    restarted = cluster.Process(args.tandem, "cache-store", c.shard_args, c.log_dir,
                                listen=shard.address)
    c.all.insert(0, restarted)
    with open(restarted.log.name) as f:
        recovered = [line for line in f if "blocks recovered" in line]
    print(f"  restarted: {recovered[-1].strip() if recovered else '(no recovery line)'}")
    assert recovered and " 0 blocks recovered" not in recovered[-1], recovered
    # The workers reconnect (gRPC's backoff) and map the new arena; until then their puts and
    # gets fail and prompts are recomputed. First-pass prompts no worker holds any more:
    restored = lambda: restarted.metric("tandem_cache_store_tier_lookups_total",
                                        {"tier": "disk", "result": "hit"})
    def seen(seconds):  # the shard's metrics refresh every 0.5 s
        try:
            cluster.wait_for(lambda: restored() > 0, seconds, "a disk hit")
            return True
        except AssertionError:
            return False
    for i in range(6, len(reqs)):
        check_greedy(run_concurrently(stub, [reqs[i]]), [reqs[i]], [want[i]],
                     f"after the restart, prompt {i + 1}")
        if seen(1.0):
            break
    print(f"  disk hits after the restart: {restored()}")
    assert restored() and restored() > 0, restored()


def case_api(c, stub):
    bad = [
        ("empty prompt", pb.GenerateRequest(sampling=pb.SamplingParams(max_tokens=4))),
        ("both forms", pb.GenerateRequest(prompt="hi", prompt_token_ids=[1],
                                          sampling=pb.SamplingParams(max_tokens=4))),
        ("max_tokens 0", request([1, 2], 0)),
        ("max_tokens past the context", request([1, 2], 2047)),
        ("prompt past the context", request([5] * 2049, 1)),
        ("temperature < 0", request([1, 2], 4, temperature=-1)),
        ("top_p > 1", request([1, 2], 4, top_p=1.5)),
        ("top_p < 0", request([1, 2], 4, top_p=-0.5)),
        ("id outside the vocabulary", request([1, VOCAB], 4)),
    ]
    for what, req in bad:
        _, _, code, details = stream(stub, req)
        print(f"{what}: {code.name}: {details}")
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details, what
    # Invalid UTF-8 in `prompt`: grpcio will not serialise it, so send the bytes by hand.
    raw = bytes([0x12, 4]) + b"a\xc3(b" + bytes([0x22, 2, 0x28, 4])
    call = c.channel.unary_stream("/tandem.v1.Inference/Generate",
                                  request_serializer=lambda b: b,
                                  response_deserializer=pb.GenerateResponse.FromString)
    try:
        list(call(raw, timeout=30))
        raise AssertionError("invalid UTF-8 was accepted")
    except grpc.RpcError as e:
        print(f"invalid UTF-8: {e.code().name}: {e.details()}")
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details()

    # Health and reflection on every process.
    for proc in c.all:
        ch = grpc.insecure_channel(proc.address)
        status = cluster.health_status(ch)
        names = cluster.reflected_services(ch)
        print(f"{proc.role}: health {status}, reflection lists {names}")
        assert status == "SERVING", (proc.role, status)
        assert "grpc.health.v1.Health" in names and any(n.startswith("tandem.v1.") for n in names)
        ch.close()

    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
    print(f"model info: {info}".replace("\n", " "))
    assert info.context_length == 2048 and info.vocab_size == VOCAB and info.name

    # Text in, text out.
    text = ""
    for msg in stub.Generate(pb.GenerateRequest(prompt="def quicksort(arr):",
                                                sampling=pb.SamplingParams(max_tokens=24)),
                             timeout=60):
        text += msg.chunk.text if msg.HasField("chunk") else ""
    print(f"text: {text!r}")
    assert text

    # Cancel mid-stream: every block is free again shortly after.
    def cancel(call, tokens):
        if tokens >= 4:
            call.cancel()
    _, _, code, _ = stream(stub, request([7] * 100, 1500), on_chunk=cancel)
    assert code == grpc.StatusCode.CANCELLED, code
    t0 = time.monotonic()
    wait_blocks_free(c, timeout=3)
    print(f"cancelled stream freed everything in {time.monotonic() - t0:.2f} s (metrics refresh "
          f"every 0.5 s)")

    # Shutdown: the request in flight completes, new ones are UNAVAILABLE.
    results = {}
    first = threading.Event()

    def long_request():
        results["long"] = stream(stub, request([9] * 20, 300),
                                 on_chunk=lambda call, n: first.set())
    t = threading.Thread(target=long_request)
    t.start()
    assert first.wait(60)
    c.router.proc.send_signal(15)
    # Draining is observable: the router's health turns NOT_SERVING.
    cluster.wait_for(lambda: cluster.health_status(c.channel) == "NOT_SERVING", 10,
                     "the router to report NOT_SERVING")
    _, _, code, details = stream(stub, request([1, 2, 3], 2))
    print(f"after SIGTERM: {code.name}: {details}")
    assert code == grpc.StatusCode.UNAVAILABLE and "shutting down" in details, (code, details)
    t.join()
    ids, complete, code, details = results["long"]
    assert code == grpc.StatusCode.OK and len(ids) == 300, (code, details, len(ids))


def case_serve():
    """`tandem serve` (every role in one process) and `tandem generate` against it."""
    # A device that is no device is refused at startup, by name.
    bad = subprocess.run([args.tandem, "serve", "--model", args.model, "--listen", "127.0.0.1:0",
                          "--metrics-listen", "", "--set", "serve.decode_device=gpu"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0, bad.stdout
    assert 'device "gpu": expected cpu, cuda or cuda:N' in bad.stderr, bad.stderr
    prompt = "def quicksort(arr):"
    ref = subprocess.run([args.model_inspect, "generate", "--model", args.model, "--prompt",
                          prompt, "--max-tokens", "40"],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    # Concurrent greedy requests of mixed lengths.
    reqs = random_requests(12, 27, 300, 24)
    want = expected(reqs)
    # The default (auto: colocated on one CPU) and the disaggregated path, in one process each.
    for mode, extra in (("colocated", []), ("disaggregated", ["--set", "serve.mode=disaggregated"])):
        proc = subprocess.Popen([args.tandem, "serve", "--model", args.model, "--listen",
                                 "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"] + extra,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            m = re.search(r"router on (\S+); metrics (\S+); (\w+) \(", line)
            assert m, line + proc.stderr.read()
            assert m.group(3) == mode, line
            assert line.rstrip().endswith("prefill on cpu, decode on cpu"), line
            out = subprocess.run([args.tandem, "generate", "--addr", m.group(1), "--prompt",
                                  prompt, "--max-tokens", "40", "--print-ids"],
                                 check=True, capture_output=True, text=True, timeout=120)
            ids = [int(t) for t in out.stdout.strip().splitlines()[-1].split(",")]
            print(f"{mode}: tandem generate: {out.stdout!r}\n{out.stderr.strip()}")
            assert ids == [int(t) for t in ref[0].split(",")], (ids, ref[0])
            assert "\n".join(ref[1:]) in out.stdout, (ref[1:], out.stdout)
            stub = pb_grpc.InferenceStub(grpc.insecure_channel(m.group(1)))
            got = run_concurrently(stub, reqs)
            for i, (toks, _, code, details) in enumerate(got):
                assert code == grpc.StatusCode.OK, (mode, details)
                assert toks == want[i], (mode, i, toks, want[i])
            print(f"{mode}: 12 concurrent streams equal model-inspect generate")
            import urllib.request
            text = urllib.request.urlopen(m.group(2), timeout=10).read().decode()
            roles = ("router", "decode") + (("prefill",) if mode == "disaggregated" else ())
            for role in roles:
                assert f'tandem_requests_running{{role="{role}"}}' in text, role
                if role != "router":  # the workers' GEMMs, labelled with their role
                    assert cluster.metric_value(m.group(2), "tandem_cpu_gemm_info",
                                                {"role": role}) == 1, (mode, role)
            assert 'tandem_requests_total{api="grpc",finish_reason="length",role="router"} 13' in text
            for phase in ("decode",) + (("prefill",) if mode == "disaggregated" else ()):
                turns = cluster.metric_value(m.group(2), "tandem_compute_turns_total",
                                             {"device": "cpu", "phase": phase})
                assert turns and turns > 0, (mode, phase, turns)
        finally:
            proc.send_signal(15)
            assert proc.wait(timeout=60) == 0, proc.stderr.read()
    # Quantized at load (model.weight_quantization), prefill and decode apart: the stream equals
    # model-inspect's greedy generation on the same quantized weights, and differs from the
    # float model's (so the setting reached both engines). Again with int8 activations
    # (model.activation_quantization), the integer kernels where the CPU has them.
    for activations in ("none", "int8"):
        quant = ["--weight-quantization", "int4", "--weight-quantization-group-size", "32",
                 "--activation-quantization", activations]
        qref = subprocess.run([args.model_inspect, "generate", "--model", args.model, "--prompt",
                               prompt, "--max-tokens", "40"] + quant,
                              check=True, capture_output=True, text=True).stdout.splitlines()
        assert qref[0] != ref[0], "int4 generated exactly what bf16 did"
        proc = subprocess.Popen([args.tandem, "serve", "--model", args.model, "--listen",
                                 "127.0.0.1:0", "--metrics-listen", "", "--set",
                                 "serve.mode=disaggregated", "--set",
                                 "model.weight_quantization=int4", "--set",
                                 "model.weight_quantization_group_size=32", "--set",
                                 "model.activation_quantization=" + activations],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            m = re.search(r"router on (\S+);", line)
            assert m, line + proc.stderr.read()
            for _ in range(2):  # the second time from the prefix cache, under the int4 hashes
                out = subprocess.run([args.tandem, "generate", "--addr", m.group(1), "--prompt",
                                      prompt, "--max-tokens", "40", "--print-ids"],
                                     check=True, capture_output=True, text=True, timeout=120)
                ids = out.stdout.strip().splitlines()[-1]
                assert ids == qref[0], (activations, ids, qref[0])
            print(f"int4-g32 (activations {activations}) disaggregated: tandem generate equals "
                  f"model-inspect generate: {ids}")
        finally:
            proc.send_signal(15)
            assert proc.wait(timeout=60) == 0, proc.stderr.read()
    # The setting reaches the engines' loading: on float weights it is refused there.
    refused = subprocess.run([args.tandem, "serve", "--model", args.model, "--listen",
                              "127.0.0.1:0", "--metrics-listen", "", "--set",
                              "model.activation_quantization=int8"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "model.activation_quantization: int8 rounds the input of " \
        "quantized matrices" in refused.stderr, (refused.returncode, refused.stderr)
    print("PASS")


def case_paced():
    """Issue 17's wedge, as it was reproduced: `tandem serve` with a 1 MiB store and pacing at
    1 MiB; concurrent ~400-token prompts until the balancer engages; then rounds of requests with
    a 150 ms deadline, many of them cancelled while paced. Afterwards nothing waits at the router
    and new requests are served. Before the fix the router wedged in 4 of 5 runs here (requests
    left waiting for good, and tandem serve no longer stopping on SIGTERM)."""
    proc = subprocess.Popen([args.tandem, "serve", "--model", args.model, "--listen",
                             "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                             "--set", "serve.mode=disaggregated",
                             # prefill steps long enough to run ahead of decode, so the store
                             # evicts blocks before decode fetches them
                             "--set", "serve.prefill_chunk_tokens=2048",
                             "--set", "cache_store.capacity_bytes=1048576",
                             "--set", "balancer.max_prefill_ahead_bytes=1048576",
                             "--set", "balancer.min_lookups=5", "--set", "balancer.window_seconds=5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"router on (\S+); metrics (\S+);", line)
        assert m, line + proc.stderr.read()
        url = m.group(2)
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(m.group(1)))
        pool = concurrent.futures.ThreadPoolExecutor(64)
        for attempt in range(3):
            reqs = [request([random.Random(100 * attempt + i).randrange(VOCAB) for _ in range(400)],
                            4) for i in range(48)]
            codes = [f.result()[2] for f in [pool.submit(stream, stub, r) for r in reqs]]
            assert all(code == grpc.StatusCode.OK for code in codes), codes
            state = cluster.metric_value(url, "tandem_balancer_state")
            print(f"engage, round {attempt + 1}: balancer state {state}, hit ratio "
                  f"{cluster.metric_value(url, 'tandem_decode_kv_hit_ratio')}")
            if state == 1:
                break
        assert state == 1, "the balancer never engaged"
        expired = 0
        for rnd in range(3):
            reqs = [request([random.Random(7000 + 100 * rnd + i).randrange(VOCAB)
                             for _ in range(400)], 4) for i in range(64)]
            results = [f.result() for f in [pool.submit(stream, stub, r, 0.15) for r in reqs]]
            expired += sum(code == grpc.StatusCode.DEADLINE_EXCEEDED for _, _, code, _ in results)
            assert all(code in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED)
                       for _, _, code, _ in results), [d for _, _, _, d in results]
        print(f"short deadlines: {expired} of 192 requests expired")
        assert expired > 0
        cluster.wait_for(lambda: cluster.metric_value(
            url, "tandem_requests_waiting", {"role": "router"}) == 0, 60, "the router to drain")
        for i in range(8):
            ids, _, code, details = stream(stub, request(
                [random.Random(9000 + i).randrange(VOCAB) for _ in range(400)], 4), timeout=60)
            assert code == grpc.StatusCode.OK and len(ids) == 4, details
        print("after the deadlines: nothing waits at the router, new requests are served")
    finally:
        proc.send_signal(15)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a wedged router: leave nothing running
            proc.kill()
            proc.wait()
            raise AssertionError("tandem serve did not stop within 60 s of SIGTERM")
        assert rc == 0, proc.stderr.read()
    print("PASS")


def case_loading():
    """Readiness while the model loads: a health-only server holds the role's port."""
    import os
    import socket
    import tempfile
    work = tempfile.mkdtemp(prefix="tandem_loading_")
    for name in os.listdir(args.model):
        if name != "config.json":
            os.symlink(os.path.join(os.path.abspath(args.model), name), os.path.join(work, name))
    config = os.path.join(work, "config.json")
    with open(os.path.join(args.model, "config.json")) as f:
        config_text = f.read()
    for role, service in (("prefill", "tandem.v1.PrefillWorker"), ("decode", "tandem.v1.DecodeWorker"),
                          ("serve", "tandem.v1.Inference")):
        os.mkfifo(config)  # opening it blocks the role's model load until the test writes
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([args.tandem, role, "--model", work, "--listen",
                                 f"127.0.0.1:{port}", "--metrics-listen", ""],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stderr.readline()
            assert re.search(rf"loading; health NOT_SERVING on 127.0.0.1:{port}", line), line
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            for name in ("", service):
                got = cluster.health_status(channel, name)
                assert got == "NOT_SERVING", (role, name, got)
            time.sleep(0.5)  # still loading: the pipe has not been written
            assert cluster.health_status(channel, service) == "NOT_SERVING"
            # Unblock the reader waiting on the pipe, and leave a regular file in its place
            # for the reads after it (`serve` loads the model once per engine).
            with open(config, "w") as f:
                with open(config + ".tmp", "w") as regular:
                    regular.write(config_text)
                os.rename(config + ".tmp", config)
                f.write(config_text)
            line = proc.stdout.readline()
            assert f"127.0.0.1:{port}" in line, line + proc.stderr.read()

            def serving():
                try:
                    return all(cluster.health_status(channel, n) == "SERVING" for n in ("", service))
                except grpc.RpcError:
                    return False  # reconnecting from the loading server to the role's own

            cluster.wait_for(serving, 10, f"{role} to turn SERVING on port {port}")
            print(f"{role}: NOT_SERVING while loading, SERVING on 127.0.0.1:{port} once loaded")
        finally:
            proc.send_signal(15)
            assert proc.wait(timeout=60) == 0, proc.stderr.read()
            os.unlink(config)
    # SIGTERM while loading stops the process at once: nothing to drain yet.
    os.mkfifo(config)
    proc = subprocess.Popen([args.tandem, "decode", "--model", work, "--listen", "127.0.0.1:0",
                             "--metrics-listen", ""],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "loading; health NOT_SERVING" in proc.stderr.readline()
        start = time.monotonic()
        proc.send_signal(15)
        code = proc.wait(timeout=10)
        took = time.monotonic() - start
        err = proc.stderr.read()
        assert code == 0 and "signal 15 while loading, stopping" in err, (code, err)
        print(f"decode: SIGTERM while loading, stopped in {took:.2f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.unlink(config)
    shutil.rmtree(work, ignore_errors=True)
    print("PASS")


def case_shard_label():
    """A store shard on a wildcard address labels its metrics with the host name and port."""
    import socket
    import urllib.request
    # Plaintext beyond loopback needs the explicit opt-out (security_test covers the refusal).
    proc = subprocess.Popen([args.tandem, "cache-store", "--listen", "0.0.0.0:0",
                             "--metrics-listen", "127.0.0.1:0",
                             "--set", "security.allow_insecure=true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"serving on 0\.0\.0\.0:(\d+); metrics (\S+)", line)
        assert m, line + proc.stderr.read()
        text = urllib.request.urlopen(m.group(2), timeout=10).read().decode()
        want = (f'tandem_cache_store_capacity_bytes{{shard="{socket.gethostname()}:{m.group(1)}",'
                'tier="memory"}')
        assert want in text, (want, [l for l in text.splitlines() if "capacity" in l])
        print(want)
    finally:
        proc.send_signal(15)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    print("PASS")


def transfers(w, transport, result="ok"):
    """KV transfers the worker `w` made over `transport`: puts for a prefill, gets for a decode."""
    direction = "put" if w.role == "prefill" else "get"
    return w.metric("tandem_kv_transport_transfers_total",
                    {"role": w.role, "transport": transport, "direction": direction,
                     "result": result}) or 0


def case_fabric(c, stub):
    reqs = random_requests(40, seed=5, max_prompt=300, max_out=30)
    want = expected(reqs)
    t0 = time.monotonic()
    check_greedy(run_concurrently(stub, reqs), reqs, want, "ucx")
    print(f"40 concurrent requests over UCX in {time.monotonic() - t0:.1f} s")
    for s in c.shards:
        with open(s.log.name) as f:
            assert "KV fabric: UCX serves the arena" in f.read(), f"shard {s.address} has no fabric"
    # Every transfer crossed the fabric; none fell back to the stream.
    for w in c.prefills + c.decodes:
        cluster.wait_for(lambda: transfers(w, "ucx") > 0, 5, f"{w.role}'s UCX transfers")
        print(f"  {w.role} {w.address}: {transfers(w, 'ucx'):.0f} over UCX, "
              f"{transfers(w, 'grpc'):.0f} over gRPC")
        assert transfers(w, "grpc") == 0 and transfers(w, "grpc", "failed") == 0

    # The shards count what their fabric moved, and refused nothing an honest worker sent.
    def shard_messages(s, direction, outcome):
        return s.metric("tandem_cache_store_fabric_messages_total",
                        {"direction": direction, "outcome": outcome}) or 0
    for direction in ("put", "get"):
        cluster.wait_for(lambda: sum(shard_messages(s, direction, "moved") for s in c.shards) > 0,
                         5, f"the shards' fabric {direction} messages")
    for s in c.shards:
        refused = sum(shard_messages(s, d, "refused") for d in ("put", "get"))
        moved = [shard_messages(s, d, "moved") for d in ("put", "get")]
        print(f"  shard {s.address}: {moved[0]:.0f} put and {moved[1]:.0f} get messages over "
              f"UCX, {refused:.0f} refused")
        assert refused == 0
    # kill -9 of a shard while blocks move: its blocks are recomputed, no request fails.
    load = random_requests(20, seed=6, max_prompt=300, max_out=30)
    on_chunk, t, killed = after_streams(2, c.shards[0].kill9)
    t0 = time.monotonic()
    check_greedy(run_concurrently(stub, load, on_chunk), load, expected(load), "kill -9 shard")
    t.join()
    assert killed.is_set()
    failed = sum(transfers(w, "ucx", "failed") for w in c.prefills + c.decodes)
    print(f"  after kill -9 of a shard: every request completed in "
          f"{time.monotonic() - t0:.1f} s; {failed:.0f} UCX transfers failed (recomputed)")


def rss_shmem(pid):
    """Bytes of shared memory the process has mapped in (RssShmem): the arena pages it reached."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssShmem in /proc/{pid}/status")


def case_preallocate(c, stub):
    """cache_store.preallocate: the shard allocates its whole arena before it serves, the workers
    attach as they start, before any request, and map all of it (so no put or get faults pages
    in), and requests come out as the single engine's."""
    arena = 64 << 20
    shard = c.shards[0]
    print(f"shard: {rss_shmem(shard.proc.pid) >> 20} MiB of shared memory mapped at startup")
    assert rss_shmem(shard.proc.pid) >= arena
    with open(shard.log.name) as f:
        assert "preallocated the 64 MiB arena" in f.read()
    # What a worker is told when it attaches: the arena is there to map, and the lease time
    # (cache_store.lease_seconds) it trusts its reads and reservations by.
    from tandem.v1 import cache_store_pb2, cache_store_pb2_grpc
    attach = cache_store_pb2_grpc.CacheStoreStub(grpc.insecure_channel(shard.address)) \
        .AttachSharedMemory(cache_store_pb2.AttachSharedMemoryRequest(), timeout=10)
    print(f"attach: preallocated={attach.preallocated}, lease_ms={attach.lease_ms}")
    assert attach.preallocated and attach.lease_ms == 7000, attach
    for w in c.prefills + c.decodes:
        cluster.wait_for(lambda: rss_shmem(w.proc.pid) >= arena, 30,
                         f"{w.role} {w.address} to map the whole arena before any request")
        print(f"  {w.role} {w.address}: {rss_shmem(w.proc.pid) >> 20} MiB of the arena mapped "
              f"before any request")
        assert transfers(w, "shm") == 0
    reqs = random_requests(12, seed=9, max_prompt=300, max_out=10)
    check_greedy(run_concurrently(stub, reqs), reqs, expected(reqs), "preallocated arena")
    for w in c.prefills + c.decodes:
        print(f"  {w.role} {w.address}: {transfers(w, 'shm'):.0f} transfers over shared memory")
        assert transfers(w, "shm") > 0


def main():
    if args.case == "shard_label":
        return case_shard_label()
    if args.case == "serve":
        return case_serve()
    if args.case == "loading":
        return case_loading()
    if args.case == "paced":
        return case_paced()
    extra_router = []
    store_bytes = None
    if args.case == "hang":
        extra_router = ["--set", "router.worker_keepalive_seconds=1"]
    shard_extra = []
    if args.case == "balancer":
        store_bytes = "1MiB"
    if args.case == "fabric":
        # As on Kubernetes (deploy/k8s): the shards hand out no shared memory, and the fabric
        # still moves the blocks in and out of their arenas.
        shard_extra = ["--set", "cache_store.shared_memory=false"]
    if args.case == "preallocate":
        store_bytes = "64MiB"
        shard_extra = ["--set", "cache_store.preallocate=true",
                       "--set", "cache_store.lease_seconds=7"]
    if args.case == "disk":
        store_bytes = "2MiB"
        disk_dir = tempfile.mkdtemp(prefix="tandem_disk_")
        shard_extra = ["--set", f"cache_store.disk.directory={disk_dir}",
                       "--set", "cache_store.disk.capacity_bytes=32MiB",
                       "--set", "cache_store.disk.segment_bytes=4MiB"]
        extra_router = ["--set", "balancer.window_seconds=2", "--set", "balancer.min_lookups=20"]
    # Workers join through the registry in the greedy and fault cases, static lists elsewhere;
    # in the greedy case they advertise their host alone, as on Kubernetes, and add the port.
    c = cluster.Cluster(args.tandem, args.model, store_bytes=store_bytes, shard_extra=shard_extra,
                        shards=1 if args.case in ("disk", "preallocate") else 2,
                        extra={"pruning": PRUNING_CONFIG, "mixed": MIXED_CONFIG,
                               "disk": LITTLE_LOCAL_KV,
                               "faults": STREAM_IN_THREES,
                               "fabric": ["--set", "cache_store.transport=ucx"]}.get(args.case, ()),
                        router_extra=extra_router, register=args.case in ("greedy", "faults", "hang"),
                        advertise="127.0.0.1" if args.case == "greedy" else None)
    c.channel = grpc.insecure_channel(c.router.address)
    stub = pb_grpc.InferenceStub(c.channel)
    try:
        {"greedy": case_greedy, "faults": case_faults, "hang": case_hang,
         "balancer": case_balancer, "api": case_api, "pruning": case_pruning,
         "mixed": case_mixed, "disk": case_disk, "fabric": case_fabric,
         "preallocate": case_preallocate}[args.case](c, stub)
    except BaseException:
        c.stop(keep_logs=True)
        print(c.logs())
        raise
    c.stop()
    if args.case == "disk":
        shutil.rmtree(disk_dir, ignore_errors=True)
    print("PASS")


main()
