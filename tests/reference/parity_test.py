#!/usr/bin/python3
"""Parity of the C++ engine (model-inspect) with the independent torch reference.

For each case: generate a random model with make-random-model, run `model-inspect forward` on
a 40-token random prompt and compare every position's logits with hf_reference.py (float64 on
the same, possibly half-precision-rounded, weights); then run `model-inspect generate` greedily
for 64 tokens and check each generated id against the reference (teacher-forced on the engine's
own sequence). Exit 0 on pass, 1 on fail, 77 when torch is unavailable.

  /usr/bin/python3 parity_test.py --case llama \
      --model-inspect build/tools/model_inspect/model-inspect \
      --make-model build/tools/make_random_model/make-random-model --workdir /tmp/parity
  --case all runs every random-model case. --case model_dir --model-dir DIR checks a trained
  model directory (the bundled model under models/) instead of a random one.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

try:
    import numpy as np
    import torch  # noqa: F401  (hf_reference needs it)
except ImportError as e:
    print("SKIP: torch/numpy unavailable for %s: %s" % (sys.executable, e))
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402

PROMPT_LEN = 40
GREEDY_STEPS = 64

# Tolerances on |engine - reference| / std(reference logits) over all prompt positions: (max,
# mean). The reference is float64 on the same (possibly half-precision-rounded) weights, so
# weight rounding is never counted as error; what remains is the engine's arithmetic.
#  * fp32: float32 arithmetic against float64 lands near 1e-7 for these tiny models; 1e-3 leaves
#    a wide margin, while every modelling bug probed by `hf_reference.py --selftest` (RoPE
#    pairing or scaling, rms eps, q/k norm, GQA grouping) moves logits by > 10x that.
#  * bf16 / fp16: the engine may keep activations or its KV cache in half precision. The bound
#    is "no worse than Hugging Face's own eager execution in that dtype", measured with the
#    reference's native-dtype emulation on the half-precision cases over 5 seeds:
#      bf16: max 0.065-0.18, mean 0.009-0.014;  fp16: max 0.013-0.030, mean 0.0017-0.0022
#    (a bf16 KV cache alone gives max 0.017-0.056; an fp16 one 0.003-0.006). Tolerances are
#    ~1.4x the worst observation. Gross dtype bugs (bf16 read as fp16, wrong byte order) are
#    errors of order 1 and fail clearly.
TOLERANCE = {"fp32": (1e-3, 1e-4), "fp16": (0.05, 0.004), "bf16": (0.25, 0.025)}
# An int8 KV cache against the reference rounding K/V the same way (f32 weights): the fp32
# bound holds (measured 3-4e-6: no element of these cases lands on the other side of a rounding
# boundary), while the same engine output against the unrounded reference is off by ~0.1.
TOLERANCE_INT8_KV = TOLERANCE["fp32"]
# model.cpu_gemm: onednn on bf16 weights against the reference rounding the same matrix inputs
# to bf16: the products agree to f32 rounding (2e-7) until an input lands on the other side of a
# bf16 rounding boundary (a 1e-7 difference upstream decides it), which moves that position's
# and later logits by up to ~1.5e-2 std (measured: max 1.5e-2, mean 1.2e-3 on
# llama3_bf16_onednn, where position 10 flips; against a reference that does not round, max
# 3-5e-2 and mean 5-7e-3, which the mean bound catches).
TOLERANCE_BF16_INPUTS = (3e-2, 3e-3)

# Greedy check: the engine's token at each step must be the reference argmax given the engine's
# own prefix, except at a near tie, where the reference's top logit beats the engine's choice by
# no more than the allowed logit error (max tolerance * std): at that precision the step cannot
# be decided. Exemptions are printed with their margins. In half precision the allowed error is
# large (~0.2-0.4 logits), and HF-like execution flipped up to 4 of 64 such steps in our
# measurements, hence the larger cap.
MAX_NEAR_TIES = {"fp32": 3, "fp16": 8, "bf16": 8}

# Case -> make-random-model flags. All tiny (2 layers, hidden 64) so each case takes seconds.
CASES = {
    # Llama-2 style: multi-head attention, untied lm_head.
    "llama": dict(arch="llama", heads=4, kv_heads=4, tie=False, sampler_check=True),
    # Llama-3 style: GQA, tied embeddings, rope_theta 500000 and llama3 rope scaling with a
    # small original context (64) so that the kept / interpolated / slowed frequency bands all
    # matter within the 104 positions tested.
    "llama3": dict(arch="llama", heads=4, kv_heads=2, tie=True, rope_theta=500000,
                   rope_scaling="llama3", rope_original_max_pos=64),
    # Mistral: GQA, sliding_window null. A large rms eps makes eps handling observable.
    "mistral": dict(arch="mistral", heads=4, kv_heads=2, tie=False, rms_eps=1e-2),
    # Qwen2: q/k/v biases, tied embeddings, theta 1e6.
    "qwen2": dict(arch="qwen2", heads=4, kv_heads=2, tie=True),
    # Qwen3: per-head q/k RMSNorm, head_dim 32 != hidden / heads = 16.
    "qwen3": dict(arch="qwen3", heads=4, kv_heads=2, head_dim=32, tie=False),
    # Multi-query attention.
    "mqa": dict(arch="llama", heads=4, kv_heads=1, tie=False),
    # Weights split over three safetensors files with an index, three layers.
    "sharded": dict(arch="llama", heads=4, kv_heads=2, tie=False, layers=3, shards=3),
    # Sizes that are not multiples of SIMD widths or GEMM tiles: 3 heads of 32 on hidden 96,
    # ffn 200, vocab 1003, multi-query.
    "odd_sizes": dict(arch="llama", heads=3, kv_heads=1, hidden=96, head_dim=32, ffn=200,
                      vocab=1003, tie=False),
    # Wider matrices (hidden 512, ffn 1408, vocab 4096) so blocked GEMM paths run.
    "wide": dict(arch="qwen2", heads=8, kv_heads=2, hidden=512, ffn=1408, vocab=4096, tie=True),
    # Half-precision weights.
    "llama3_bf16": dict(arch="llama", heads=4, kv_heads=2, tie=True, rope_theta=500000,
                        rope_scaling="llama3", rope_original_max_pos=64, dtype="bf16"),
    "qwen3_bf16": dict(arch="qwen3", heads=4, kv_heads=2, head_dim=32, dtype="bf16"),
    "qwen2_fp16": dict(arch="qwen2", heads=4, kv_heads=2, tie=True, dtype="fp16"),
    "mistral_fp16": dict(arch="mistral", heads=4, kv_heads=1, dtype="fp16"),
    # An int8 KV cache (per token and head scales), compared with the reference rounding its
    # K/V the same way: GQA with llama3 RoPE, and Qwen3's q/k norms with head_dim 32.
    "llama3_int8kv": dict(arch="llama", heads=4, kv_heads=2, tie=True, rope_theta=500000,
                          rope_scaling="llama3", rope_original_max_pos=64, kv_dtype="int8"),
    "qwen3_int8kv": dict(arch="qwen3", heads=4, kv_heads=2, head_dim=32, kv_dtype="int8"),
    # Weights quantized at load (model.weight_quantization), compared with the reference
    # quantizing them by GPTQ's round-to-nearest definition: int8 with one scale per row on
    # Llama-3, int4 in groups of 32 on Qwen2 (biases, tied embeddings) and of 16 on Qwen3
    # (q/k norms, bf16 weights). The fp32 bound holds: the reference computes in float64 on the
    # same dequantized weights.
    "llama3_int8w": dict(arch="llama", heads=4, kv_heads=2, tie=True, rope_theta=500000,
                         rope_scaling="llama3", rope_original_max_pos=64,
                         weight_quantization=(8, -1)),
    "qwen2_int4w": dict(arch="qwen2", heads=4, kv_heads=2, tie=True, ffn=96,
                        weight_quantization=(4, 32)),
    "qwen3_int4w_bf16": dict(arch="qwen3", heads=4, kv_heads=2, head_dim=32, dtype="bf16",
                             weight_quantization=(4, 16)),
    # GPTQ checkpoints (written by write_gptq below from the format's definition), read back by
    # the reference's own dequantization: 4-bit in groups of 32 on Llama, 8-bit with zero
    # points and one group per row on Qwen2.
    "llama_gptq4": dict(arch="llama", heads=4, kv_heads=2, tie=False, gptq=(4, 32, True)),
    "qwen2_gptq8_asym": dict(arch="qwen2", heads=4, kv_heads=2, tie=True, ffn=96,
                             gptq=(8, -1, False)),
    # Act-order (desc_act): each group's columns scattered over the input as g_idx says, in a
    # permutation shared by the matrices that read one input (q/k/v, gate/up), as GPTQ's
    # Hessian order is, except layer 1's k_proj, which has its own.
    "qwen3_gptq4_act": dict(arch="qwen3", heads=4, kv_heads=2, head_dim=32, tie=False,
                            gptq=(4, 16, False, True)),
    # Checkpoints written by make-random-model --quantize (Tandem's writer), read back by the
    # reference's dequantization of each format from its definition: AWQ (GEMM packing, zero
    # points), compressed-tensors int8 per channel, int8 per group with zero points, W8A8
    # (activations rounded to int8 per token in both) and 4-bit pack-quantized.
    "llama_awq4": dict(arch="llama", heads=4, kv_heads=2, tie=True,
                       quantize=("awq", 4, 32, "false", "float")),
    "qwen2_ct_int8": dict(arch="qwen2", heads=4, kv_heads=2, tie=False, ffn=96,
                          quantize=("compressed-tensors", 8, -1, "true", "float")),
    "llama_ct_int8_g32_asym": dict(arch="llama", heads=4, kv_heads=2, tie=True,
                                   quantize=("compressed-tensors", 8, 32, "false", "float")),
    # model.activation_quantization: int8 (inputs rounded in blocks of 32) on weights quantized
    # at load (4-bit, groups of 32) and on a GPTQ checkpoint (8-bit with zeros, one group per
    # row): the integer kernels where the CPU has AVX512-VNNI.
    "llama3_int4w_a8": dict(arch="llama", heads=4, kv_heads=2, tie=True, rope_theta=500000,
                            rope_scaling="llama3", rope_original_max_pos=64,
                            weight_quantization=(4, 32), activations="int8"),
    "qwen2_gptq8_asym_a8": dict(arch="qwen2", heads=4, kv_heads=2, tie=True, ffn=96,
                                gptq=(8, -1, False), activations="int8"),
    "qwen3_ct_w8a8": dict(arch="qwen3", heads=4, kv_heads=2, head_dim=32, tie=True,
                          quantize=("compressed-tensors", 8, -1, "true", "int8")),
    "mistral_ct_w4_g16": dict(arch="mistral", heads=4, kv_heads=2, tie=False,
                              quantize=("compressed-tensors", 4, 16, "true", "float")),
    # lm_head quantized too: GPTQ lm_head true on a tied model (written untied), and
    # compressed-tensors with lm_head not in ignore.
    "llama_gptq4_head": dict(arch="llama", heads=4, kv_heads=2, tie=True,
                             quantize=("gptq", 4, 32, "false", "float", "true")),
    "qwen2_ct_int8_head": dict(arch="qwen2", heads=4, kv_heads=2, tie=False, ffn=96,
                               quantize=("compressed-tensors", 8, -1, "true", "float", "true")),
    # model.lm_head_quantization: int8 (one scale per row) on a tied head (a quantized copy; the
    # embedding keeps its weights) with 4-bit layers and int8 activations, and on an untied
    # head of float layers.
    "llama3_int4w_a8_head8": dict(arch="llama", heads=4, kv_heads=2, tie=True, rope_theta=500000,
                                  rope_scaling="llama3", rope_original_max_pos=64,
                                  weight_quantization=(4, 32), activations="int8",
                                  lm_head_quantization=(8, -1)),
    "qwen2_head8": dict(arch="qwen2", heads=4, kv_heads=2, tie=False, ffn=96,
                        lm_head_quantization=(8, -1)),
    # model.cpu_gemm: onednn (oneDNN's matmul on weights prepacked at load): f32 with an untied
    # lm_head (which it multiplies too), odd sizes, q/k/v biases on wider matrices, and bf16
    # weights, whose matrix inputs it rounds to bf16, as the reference then does too: the fp32
    # bound holds (bf16 products are exact in f32). The logits must also stay within
    # ONEDNN_VS_OWN of the own kernels'. Skipped where oneDNN has no matmul for the dtype.
    "llama_onednn": dict(arch="llama", heads=4, kv_heads=4, tie=False, cpu_gemm="onednn"),
    "mistral_bf16_onednn": dict(arch="mistral", heads=4, kv_heads=2, tie=False, rms_eps=1e-2,
                                dtype="bf16", cpu_gemm="onednn"),
    "odd_sizes_onednn": dict(arch="llama", heads=3, kv_heads=1, hidden=96, head_dim=32, ffn=200,
                             vocab=1003, tie=False, cpu_gemm="onednn"),
    "wide_onednn": dict(arch="qwen2", heads=8, kv_heads=2, hidden=512, ffn=1408, vocab=4096,
                        tie=True, cpu_gemm="onednn"),
    "llama3_bf16_onednn": dict(arch="llama", heads=4, kv_heads=2, tie=True, rope_theta=500000,
                               rope_scaling="llama3", rope_original_max_pos=64, dtype="bf16",
                               cpu_gemm="onednn"),
    # f16 weights: oneDNN rounds them to bf16 on a CPU with bf16 dot products (the reference
    # then rounds them too), else widens them to f32, where the fp32 bound holds. Tied: the
    # embedding's rows come from the packed lm_head.
    "qwen2_fp16_onednn": dict(arch="qwen2", heads=4, kv_heads=2, tie=True, dtype="fp16",
                              cpu_gemm="onednn"),
    "qwen3_bf16_onednn": dict(arch="qwen3", heads=4, kv_heads=2, head_dim=32, tie=False,
                              dtype="bf16", cpu_gemm="onednn"),
    # A trained model directory given with --model-dir (the bundled model), bf16 weights.
    "model_dir": dict(dtype="bf16"),
}

# oneDNN against the own kernels on the same model, max |diff| / std(logits): f32 differs only
# in the order of f32 sums; bf16 also rounds every matrix input to bf16 (issue #25's bound).
# Measured on the tiny random bf16 cases: 4-7e-2 (mean ~6e-3), as HF's own bf16 execution
# differs from float32; the bf16 parity bound applies.
ONEDNN_VS_OWN = {"fp32": 1e-4, "bf16": TOLERANCE["bf16"][0]}


class CaseSkipped(Exception):
    """The case cannot run on this machine (the message says why)."""


def make_model_args(case, spec, out):
    args = ["--out", out, "--arch", spec["arch"], "--heads", spec["heads"],
            "--kv-heads", spec["kv_heads"], "--dtype", spec.get("dtype", "fp32"),
            "--tie-embeddings", "true" if spec.get("tie") else "false",
            "--seed", sum(map(ord, case))]
    if "quantize" in spec:
        fmt, bits, group, sym, activations = spec["quantize"][:5]
        args += ["--quantize", fmt, "--quant-bits", bits, "--quant-group-size", group,
                 "--quant-sym", sym, "--quant-activations", activations]
        if len(spec["quantize"]) > 5:
            args += ["--quant-lm-head", spec["quantize"][5]]
    for key, flag in (("layers", "--layers"), ("head_dim", "--head-dim"), ("hidden", "--hidden"),
                      ("ffn", "--ffn"), ("vocab", "--vocab"),
                      ("rope_theta", "--rope-theta"), ("rope_scaling", "--rope-scaling"),
                      ("rope_original_max_pos", "--rope-original-max-pos"),
                      ("rms_eps", "--rms-eps"), ("shards", "--shards")):
        if key in spec:
            args += [flag, spec[key]]
    return [str(a) for a in args]


def act_order(name, k, group):
    """g_idx [k] of an act-order layer: the columns in a permutation (GPTQ: by decreasing
    Hessian diagonal), column perm[j] in group j // group. The permutation depends on the layer
    and the input the matrix reads (q/k/v share one, gate/up another), except layer 1's k_proj,
    which has its own."""
    kind = ("o" if "o_proj" in name else "down" if "down_proj" in name else
            "qkv" if "_attn." in name else "mlp")
    if "layers.1.self_attn.k_proj" in name:
        kind = "k"
    seed = sum(map(ord, name.split(".self_attn")[0].split(".mlp")[0] + kind))
    perm = torch.from_numpy(np.random.RandomState(seed).permutation(k))
    g_idx = torch.empty(k, dtype=torch.int64)
    g_idx[perm] = torch.arange(k) // group
    return g_idx


def write_gptq(model_dir, bits, group, sym, desc_act=False):
    """Rewrites the float model in model_dir as a GPTQ (v1) checkpoint: each decoder matrix
    rounded to nearest per row and group (scales rounded to fp16; symmetric zero 2^(bits-1),
    else round(-min(w, 0) / scale)) and packed as AutoGPTQ packs qweight, qzeros, scales and
    g_idx (see hf_reference.gptq_dequantize). desc_act: groups of columns in act_order's
    permutation, the columns stored in their own order."""
    import json
    import struct
    path = os.path.join(model_dir, "model.safetensors")
    tensors, _ = hf_reference.read_safetensors(path)
    maxq, pf = 2 ** bits - 1, 32 // bits
    out = {}
    for name, t in tensors.items():
        if not any(name.endswith(p + ".weight") for p in hf_reference.LINEAR_NAMES):
            out[name] = ("F32", t.to(torch.float32).numpy())
            continue
        w = t.to(torch.float32)
        n, k = w.shape
        g = k if group <= 0 else group
        g_idx = act_order(name, k, g) if desc_act else torch.arange(k) // g
        order = torch.argsort(g_idx, stable=True)  # the columns group by group
        x = w[:, order].reshape(n, k // g, g)
        lo = torch.clamp(x.amin(-1), max=0)
        hi = torch.clamp(x.amax(-1), min=0)
        if sym:
            hi = torch.maximum(-lo, hi)
            lo = -hi
        scale = ((hi - lo) / maxq).to(torch.float16).to(torch.float32)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero = (torch.full_like(scale, (maxq + 1) // 2) if sym
                else torch.clamp(torch.round(-lo / scale), 0, maxq))
        codes = torch.clamp(torch.round(x / scale[..., None]) + zero[..., None], 0, maxq)
        codes = codes.reshape(n, k).to(torch.int64)[:, torch.argsort(order)].T  # [k, n]
        shifts = torch.arange(pf, dtype=torch.int64) * bits
        qweight = (codes.reshape(k // pf, pf, n) << shifts[None, :, None]).sum(1)
        stored = ((zero.to(torch.int64) - 1) & maxq).T  # [groups, n]; v1: zero 0 wraps
        qzeros = (stored.reshape(k // g, n // pf, pf) << shifts[None, None, :]).sum(2)
        prefix = name[:-len(".weight")]
        as_i32 = lambda v: (v & 0xFFFFFFFF).numpy().astype("<u4").view("<i4")
        out[prefix + ".qweight"] = ("I32", as_i32(qweight))
        out[prefix + ".qzeros"] = ("I32", as_i32(qzeros))
        out[prefix + ".scales"] = ("F16", scale.T.contiguous().to(torch.float16).numpy())
        out[prefix + ".g_idx"] = ("I32", g_idx.to(torch.int32).numpy())
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in out.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "gptq", "bits": bits, "group_size": group,
                                     "desc_act": desc_act, "sym": sym,
                                     "checkpoint_format": "gptq"}
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def run(cmd, timeout=120):
    t0 = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                          universal_newlines=True)
    if proc.returncode != 0:
        raise RuntimeError("command failed (rc %d): %s\n%s" %
                           (proc.returncode, " ".join(cmd), proc.stderr[-3000:]))
    return proc.stdout, time.time() - t0


def one_line_text(workdir, module="heapq.py", limit=None):
    """Writes a standard-library module's non-blank lines, stripped and joined by spaces, as one
    line to workdir/text.txt (so `model-inspect tokenize` gives the ids of the whole text);
    returns the path."""
    with open(os.path.join(os.path.dirname(os.__file__), module), encoding="utf-8") as f:
        text = " ".join(line.strip() for line in f if line.strip())[:limit]
    path = os.path.join(workdir, "text.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def tokenize(inspect, model_dir, path):
    """The ids of a one-line text file, without special tokens."""
    out = run([inspect, "tokenize", "--model", model_dir, "--text-file", path])[0]
    return [int(t) for t in out.strip().split(",")]


def engine_logits(inspect, model, ids, path, vocab, extra=()):
    run([inspect, "forward", "--model", model, "--tokens", ",".join(map(str, ids)),
         "--logits-out", path] + list(extra))
    data = np.fromfile(path, dtype="<f4")
    if data.size != len(ids) * vocab:
        raise RuntimeError("logits file has %d floats, want %d x %d" % (data.size, len(ids), vocab))
    return data.reshape(len(ids), vocab).astype(np.float64)


def engine_generate(inspect, model, ids, steps, extra=()):
    out, _ = run([inspect, "generate", "--model", model, "--tokens", ",".join(map(str, ids)),
                  "--max-tokens", str(steps), "--ignore-eos"] + list(extra))
    lines = [l for l in out.strip().splitlines() if l.strip()]
    if not lines:
        raise RuntimeError("generate printed nothing on stdout")
    return [int(t) for t in lines[-1].replace(" ", "").split(",") if t]


def check_greedy(ref, prompt, generated, steps, allowed_error, max_near_ties):
    """Returns (ok, summary, details): every engine choice must be the reference argmax on the
    engine's own prefix, or within `allowed_error` of it (near tie)."""
    details = []
    if len(generated) != steps:
        return False, "%d ids, want %d" % (len(generated), steps), details
    logits = ref.logits(prompt + generated[:-1])[len(prompt) - 1:]
    near_ties, mismatches = [], []
    for step, (row, tok) in enumerate(zip(logits, generated)):
        best = int(np.argmax(row))
        if tok == best:
            continue
        deficit = row[best] - row[tok]
        top2 = np.sort(row)[-2:]
        entry = (step, tok, best, deficit, top2[1] - top2[0])
        (near_ties if deficit <= allowed_error else mismatches).append(entry)
    for step, tok, best, deficit, margin in near_ties + mismatches:
        details.append("step %d: engine %d, reference %d; reference top-2 margin %.3g, engine "
                       "token %.3g below top (allowed %.3g)" % (step, tok, best, margin, deficit,
                                                                allowed_error))
    ok = not mismatches and len(near_ties) <= max_near_ties
    summary = "%d/%d exact" % (steps - len(near_ties) - len(mismatches), steps)
    if near_ties:
        summary += ", %d near-tie" % len(near_ties)
    if mismatches:
        summary += ", %d MISMATCH" % len(mismatches)
    return ok, summary, details


def diagnose(model, prompt, got, want):
    """Hints at the cause of a logits mismatch: where it starts, and whether the engine is close
    to the reference with K/V rounded to half precision or with HF-style half activations."""
    std = want.std()
    per_pos = np.abs(got - want).max(axis=1) / std
    lines = ["per-position max|diff|/std: " + " ".join("%.1e" % v for v in per_pos)]
    if per_pos[0] <= 1e-3 and per_pos.max() > 1e-2:
        lines.append("position 0 agrees: suspect attention over earlier positions or RoPE")
    elif per_pos[0] > 1e-2:
        lines.append("position 0 already differs: suspect weights / norms / MLP / lm_head "
                     "(attention there only sees the token itself)")
    for label, kw in (("K/V rounded to bf16", dict(kv_dtype="bf16")),
                      ("K/V rounded to fp16", dict(kv_dtype="fp16")),
                      ("HF-style bf16 activations", dict(native="bf16")),
                      ("HF-style fp16 activations", dict(native="fp16"))):
        alt = hf_reference.Reference.from_dir(model, **kw).logits(prompt)
        lines.append("engine vs reference with %s: max|diff|/std %.2e" %
                     (label, np.abs(got - alt).max() / std))
    return lines


def run_case(case, args):
    spec = CASES[case]
    work = os.path.join(args.workdir, case)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if case == "model_dir":
        model = args.model_dir
    else:
        model = os.path.join(work, "model")
        run([args.make_model] + make_model_args(case, spec, model))
        if "gptq" in spec:
            write_gptq(model, *spec["gptq"])
    kv_dtype = spec.get("kv_dtype")
    quant = spec.get("weight_quantization")
    head = spec.get("lm_head_quantization")
    a8 = spec.get("activations") == "int8"
    onednn = spec.get("cpu_gemm") == "onednn"
    # f16 weights on oneDNN: rounded to bf16 where the CPU has bf16 dot products (as the load
    # line says), else widened to f32, exactly.
    f16_rounded = onednn and spec.get("dtype") == "fp16" and "f16 weights rounded to bf16" in run(
        [args.model_inspect, "info", "--model", model, "--cpu-gemm", "onednn"])[0]
    onednn_bf16 = onednn and (spec.get("dtype") == "bf16" or f16_rounded)
    onednn_half = onednn and spec.get("dtype") in ("bf16", "fp16")
    ref = hf_reference.Reference.from_dir(model, kv_dtype=kv_dtype, weight_quantization=quant,
                                          activation_block=32 if a8 else None,
                                          bf16_inputs=onednn_bf16, bf16_weights=f16_rounded,
                                          lm_head_quantization=head)
    kv_flags = ["--kv-dtype", kv_dtype] if kv_dtype else []
    own_flags = list(kv_flags) + ["--cpu-gemm", "tandem"]
    # Cases without cpu_gemm test the own kernels on every CPU (auto would take oneDNN for bf16
    # and f16 weights where the CPU has bf16 dot products; the _onednn cases test that).
    kv_flags += ["--cpu-gemm", spec.get("cpu_gemm", "tandem")]
    if onednn_half:
        kv_flags += ["--kv-dtype", "fp32"]  # else K/V would round to bf16, which the reference
        own_flags += ["--kv-dtype", "fp32"]  # leaves at float64 like every other activation
    if a8:
        kv_flags += ["--activation-quantization", "int8"]
    if quant:
        kv_flags += ["--weight-quantization", "int%d" % quant[0],
                     "--weight-quantization-group-size", str(quant[1])]
        if spec.get("dtype", "fp32") != "fp32" and not kv_dtype:
            kv_flags += ["--kv-dtype", "fp32"]  # else K/V would round to the model's dtype
    if head:
        kv_flags += ["--lm-head-quantization", "int%d" % head[0]]
    # Quantized weights: the reference computes on the same dequantized matrices in float64, and
    # the engine in float32 whatever the checkpoint's dtype (no half-precision activations).
    dtype = "fp32" if quant or onednn_half else spec.get("dtype", "fp32")
    rng = np.random.RandomState(sum(map(ord, case)) + 1)
    prompt = rng.randint(0, ref.vocab, size=PROMPT_LEN).tolist()

    want = ref.logits(prompt)
    try:
        got = engine_logits(args.model_inspect, model, prompt, os.path.join(work, "logits.f32"),
                            ref.vocab, kv_flags)
    except RuntimeError as e:
        if spec.get("cpu_gemm") and "onednn has no" in str(e):
            raise CaseSkipped(str(e).strip().splitlines()[-1])
        raise
    std = want.std()
    rel = np.abs(got - want).max() / std
    rel_mean = np.abs(got - want).mean() / std
    tol, tol_mean = (TOLERANCE_INT8_KV if kv_dtype == "int8" else
                     TOLERANCE_BF16_INPUTS if onednn_bf16 else TOLERANCE[dtype])
    ok_logits = bool(rel <= tol and rel_mean <= tol_mean)
    lines = []
    if not ok_logits:
        lines += diagnose(model, prompt, got, want)
    elif dtype != "fp32" and not kv_dtype:
        # Information, not a requirement: an engine with float32 activations and a KV cache in
        # the model dtype lands within ~1e-4 of this variant of the reference.
        kv_ref = hf_reference.Reference.from_dir(model, kv_dtype=dtype).logits(prompt)
        lines.append("engine vs reference with K/V rounded to %s: max|diff|/std %.2e" %
                     (dtype, np.abs(got - kv_ref).max() / std))

    onednn_summary = ""
    if spec.get("cpu_gemm"):
        own = engine_logits(args.model_inspect, model, prompt, os.path.join(work, "own.f32"),
                            ref.vocab, own_flags)
        vs_own = np.abs(got - own).max() / std
        bound = ONEDNN_VS_OWN["bf16" if onednn_bf16 else "fp32"]
        ok_logits = ok_logits and bool(vs_own <= bound)
        onednn_summary = "  vs own kernels %.1e (tol %.0e)" % (vs_own, bound)

    generated = engine_generate(args.model_inspect, model, prompt, GREEDY_STEPS, kv_flags)
    ok_greedy, greedy_summary, details = check_greedy(ref, prompt, generated, GREEDY_STEPS,
                                                      tol * std, MAX_NEAR_TIES[dtype])
    lines += details
    if details or not ok_greedy:
        ref_ids, margins = ref.greedy_with_margins(prompt, GREEDY_STEPS)
        lines.append("reference greedy: %s" % ref_ids)
        lines.append("engine greedy:    %s" % generated)
        lines.append("reference top-2 margins (min %.3g): %s" %
                     (min(margins), " ".join("%.2g" % m for m in margins)))

    ok_sampler = True
    if spec.get("sampler_check"):
        # Sampling restricted to the top-1 token must reproduce greedy decoding.
        sampled = engine_generate(args.model_inspect, model, prompt, 16,
                                  ["--temperature", "0.8", "--top-k", "1", "--seed", "7"])
        ok_sampler = sampled == generated[:16]
        greedy_summary += ", top-k 1 sampling %s" % ("= greedy" if ok_sampler else "DIFFERS")
        if not ok_sampler:
            lines.append("top-k 1 sampled: %s" % sampled)

    ok = ok_logits and ok_greedy and ok_sampler
    summary = ("%-13s %-4s %-4s logits max|diff|/std %.2e (tol %.2g), mean %.1e (tol %.2g)"
               "%s  greedy %s" % (case, dtype, "ok" if ok else "FAIL", rel, tol, rel_mean,
                                  tol_mean, onednn_summary, greedy_summary))
    return ok, summary, lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", required=True, help="one of %s, or all" % ", ".join(CASES))
    parser.add_argument("--model-inspect", required=True)
    parser.add_argument("--make-model", help="make-random-model (for the random cases)")
    parser.add_argument("--model-dir", help="model directory for --case model_dir")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--keep", action="store_true", help="keep generated models")
    args = parser.parse_args()
    cases = list(CASES) if args.case == "all" else [args.case]
    if args.case == "all":
        cases.remove("model_dir")
    for c in cases:
        if c not in CASES:
            parser.error("unknown case %s" % c)
    if (args.case == "model_dir") != bool(args.model_dir):
        parser.error("--model-dir goes with --case model_dir, and only with it")
    tools = [args.model_inspect] + ([] if args.case == "model_dir" else [args.make_model])
    for tool in tools:
        if tool is None:
            parser.error("--make-model is required for the random-model cases")
        if not os.access(tool, os.X_OK):
            print("FAIL: %s is not an executable" % tool)
            return 1
    all_ok, summaries, skipped = True, [], 0
    for case in cases:
        t0 = time.time()
        try:
            ok, summary, lines = run_case(case, args)
        except CaseSkipped as e:
            ok, summary, lines = True, "%-13s      SKIP  %s" % (case, e), []
            skipped += 1
        except Exception as e:  # A crash of the engine is a failure of the case.
            ok, summary, lines = False, "%-13s      FAIL  %s" % (case, e), []
        summary += "  [%.1fs]" % (time.time() - t0)
        print(summary)
        for l in lines:
            print("    " + l)
        summaries.append(summary)
        all_ok &= ok
        if ok and not args.keep:
            shutil.rmtree(os.path.join(args.workdir, case), ignore_errors=True)
    if len(cases) > 1:
        print("\nsummary:\n" + "\n".join(summaries))
    if all_ok and skipped == len(cases):
        print("SKIP")
        return 77
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
