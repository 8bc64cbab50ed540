#!/usr/bin/python3
"""`model-inspect --kv-cache --pruning-stats` against the independent torch reference.

Runs the diagnostics on a bundled model with a config that prunes its last three layers and
protects three ids, then recomputes from hf_reference.py's traced forward passes (full and
pruned, float64): per pruned layer the prune ratio, the last token's attention-output cosine
("similarity"), the mean hidden-state, K and V cosines over the pruned positions, the LOW marks,
the first-token KL divergence, and every probability of the attention-map CSV. Also checks the
PNG's structure (signature, size, pixel data). Exit 0 on pass, 1 on fail, 77 without torch.

  /usr/bin/python3 pruning_stats_test.py --model-dir models/tandem-py-8l \\
      --model-inspect build/tools/model_inspect/model-inspect --workdir /tmp/pruning_stats
"""

import argparse
import csv
import math
import os
import re
import shutil
import struct
import sys
import zlib

try:
    import numpy as np
    import torch
except ImportError as e:
    print("SKIP: torch/numpy unavailable for %s: %s" % (sys.executable, e))
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402
import parity_test  # noqa: E402
from pruning_parity_test import full_depth_positions  # noqa: E402

PROTECT = 3
PRINTED = 0.005 + 2e-3  # the printout rounds to 2 decimals; float32 engine, float64 reference
LINE = re.compile(r"Layer (\d+): prune_ratio=([\d.]+), similarity=([-\d.]+) "
                  r"\(hidden ([-\d.]+), K ([-\d.]+), V ([-\d.]+)\)(  LOW.*)?$")


def cos(a, b):
    a, b = a.reshape(-1), b.reshape(-1)
    return float((a @ b) / math.sqrt(float((a @ a) * (b @ b))))


def png_size(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, chunks = 8, {}
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc, = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body), "bad CRC in %s" % kind
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 2), "want 8-bit RGB"
    assert len(zlib.decompress(chunks[b"IDAT"])) == height * (1 + 3 * width), "pixel data size"
    return width, height


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--model-inspect", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    ref = hf_reference.Reference.from_dir(args.model_dir)
    start = ref.layers - 3
    pruned_layers = set(range(start, ref.layers))

    prompt_path = parity_test.one_line_text(args.workdir, limit=700)
    config_path = os.path.join(args.workdir, "pop.yaml")
    with open(config_path, "w") as f:
        f.write("kv_cache_optimization:\n  enabled: true\n  pruning: {start_layer: %d}\n"
                "  protection: {high_frequency_tokens: %d}\n" % (start, PROTECT))
    csv_path = os.path.join(args.workdir, "attention.csv")
    png_path = os.path.join(args.workdir, "attention.png")
    out = parity_test.run([args.model_inspect, "--kv-cache", "--pruning-stats", "--model",
                           args.model_dir, "--config", config_path, "--prompt-file", prompt_path,
                           "--kv-dtype", "fp32", "--attention-csv", csv_path,
                           "--attention-png", png_path,
                           # float inputs to every matrix, as the reference computes (oneDNN's
                           # bf16 matmul, auto where the CPU has bf16 dot products, rounds them)
                           "--cpu-gemm", "tandem"])[0]
    print(out.rstrip())
    ids = parity_test.tokenize(args.model_inspect, args.model_dir, prompt_path)
    bos, eos = ref.config.get("bos_token_id"), ref.config.get("eos_token_id")
    prompt = [bos] + ids
    n = len(prompt)
    special = {bos} | set(eos if isinstance(eos, list) else [eos])
    full_depth = full_depth_positions(prompt, PROTECT, special)
    pruned_pos = [i for i in range(n) if not full_depth[i]]

    with torch.no_grad():
        tf, tp = {}, {}
        hf = ref.hidden_states(prompt, trace=tf)
        hp = ref.hidden_states(prompt, pruned_layers=pruned_layers, full_depth=full_depth,
                               trace=tp)
        lf = ref._linear(hf, "lm_head")[-1].numpy()
        lp = ref._linear(hp, "lm_head")[-1].numpy()

    checks = []
    got = {int(m.group(1)): m for m in map(LINE.match, out.splitlines()) if m}
    checks.append(("one line per pruned layer %s" % sorted(pruned_layers),
                   set(got) == pruned_layers))
    for layer in sorted(pruned_layers & set(got)):
        m = got[layer]
        want = dict(
            prune_ratio=len(pruned_pos) / n,
            similarity=cos(tf["attention"][layer][-1], tp["attention"][layer][-1]),
            hidden=np.mean([cos(tf["inputs"][layer][i], tp["inputs"][layer][i])
                            for i in pruned_pos]),
            K=np.mean([cos(tf["k"][layer][i, h], tp["k"][layer][i, h])
                       for i in pruned_pos for h in range(ref.kv_heads)]),
            V=np.mean([cos(tf["v"][layer][i, h], tp["v"][layer][i, h])
                       for i in pruned_pos for h in range(ref.kv_heads)]))
        printed = dict(zip(["prune_ratio", "similarity", "hidden", "K", "V"],
                           map(float, m.groups()[1:6])))
        ok = all(abs(printed[k] - want[k]) <= PRINTED for k in want)
        low_ok = bool(m.group(7)) == (want["similarity"] < 0.9) or \
            abs(want["similarity"] - 0.9) < 1e-3
        checks.append(("layer %d: %s (reference %s)" % (
            layer, " ".join("%s %.2f" % kv for kv in printed.items()),
            " ".join("%s %.4f" % kv for kv in want.items())), ok and low_ok))

    def log_softmax(x):
        return x - (x.max() + math.log(np.exp(x - x.max()).sum()))
    kl = float((np.exp(log_softmax(lf)) * (log_softmax(lf) - log_softmax(lp))).sum())
    m = re.search(r"KL\(full \|\| pruned\) = ([-\d.e+]+) nats", out)
    checks.append(("first-token KL %s (reference %.4g)" % (m and m.group(1), kl),
                   m is not None and abs(float(m.group(1)) - kl) <= 1e-4 + 1e-2 * kl))

    # Attention maps: the last token's softmax(q k / sqrt(d)) per layer and head.
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    group = ref.heads // ref.kv_heads
    worst = 0.0
    for name, trace in (("full", tf), ("pruned", tp)):
        table = np.zeros((ref.layers, ref.heads, n))
        for r in rows:
            table[int(r["layer"]), int(r["head"]), int(r["position"])] = float(r[name])
        for layer in range(ref.layers):
            q = trace["q"][layer][-1]
            for head in range(ref.heads):
                scores = trace["k"][layer][:, head // group] @ q[head] / math.sqrt(ref.head_dim)
                want = torch.softmax(scores, 0).numpy()
                worst = max(worst, float(np.abs(table[layer, head] - want).max()))
    checks.append(("attention CSV: %d rows, max |p - reference| %.2e" % (len(rows), worst),
                   len(rows) == ref.layers * ref.heads * n and worst <= 1e-4))
    width, height = png_size(png_path)
    checks.append(("PNG %dx%d" % (width, height),
                   (width, height) == (6 + 2 * n + 8, ref.layers * ref.heads * 4)))

    all_ok = True
    for what, ok in checks:
        print("%-4s %s" % ("ok" if ok else "FAIL", what))
        all_ok &= bool(ok)
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
