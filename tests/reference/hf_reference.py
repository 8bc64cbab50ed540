#!/usr/bin/python3
"""Independent torch reference of the Hugging Face Llama / Mistral / Qwen2 / Qwen3 forward pass.

Written from the published model semantics (not copied from transformers), used to check the
C++ engine's logits and greedy decoding. Reads Hugging Face model directories directly: the
safetensors format is parsed here, so neither `transformers` nor `safetensors` is needed.

Modes:
  * "reference" (default): weights upcast to float64, every activation in float64. This is the
    exact math the engine approximates.
  * native dtype ("bf16" / "fp16"): activations rounded to that dtype at the points where
    transformers' eager implementation rounds them for a model loaded in that dtype (matmul
    outputs, residual adds, norm outputs, RoPE products; softmax and RMS statistics in float32).
    This estimates how far Hugging Face's own half-precision execution is from the exact math.

Run `/usr/bin/python3 hf_reference.py --selftest [--make-model PATH]` for self-consistency
checks. Always use /usr/bin/python3: it is the interpreter with Debian's torch.
"""

import argparse
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    if __name__ == "__main__":
        print("SKIP: torch/numpy unavailable for %s: %s" % (sys.executable, e))
        sys.exit(77)
    raise

# ----------------------------------------------------------------------------- safetensors


def _decode(raw, dtype, shape):
    """Returns a float32 torch tensor from the raw little-endian bytes of one tensor."""
    if dtype == "F32":
        arr = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    elif dtype == "F16":
        arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        # bf16 is the top half of a float32: widen and shift into place.
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        arr = bits.view(np.float32)
    elif dtype == "F64":
        arr = np.frombuffer(raw, dtype="<f8").astype(np.float32)
    elif dtype in ("I32", "I8", "I64"):  # a quantized checkpoint's integers, kept as integers
        kind = {"I32": "<i4", "I8": "i1", "I64": "<i8"}[dtype]
        return torch.from_numpy(np.frombuffer(raw, dtype=kind).reshape(shape).copy())
    else:
        raise ValueError("unsupported safetensors dtype %s" % dtype)
    return torch.from_numpy(arr.reshape(shape).copy())


def read_safetensors(path):
    """Returns ({name: float32 tensor}, {name: safetensors dtype}) for one file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    tensors, dtypes = {}, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        tensors[name] = _decode(data[base + begin:base + end], info["dtype"], info["shape"])
        dtypes[name] = info["dtype"]
    return tensors, dtypes


def load_weights(model_dir):
    """Loads model.safetensors or every shard named in model.safetensors.index.json."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        weight_map, files = None, ["model.safetensors"]
    tensors, dtypes = {}, {}
    for name in files:
        t, d = read_safetensors(os.path.join(model_dir, name))
        tensors.update(t)
        dtypes.update(d)
    if weight_map is not None and set(weight_map) != set(tensors):
        raise ValueError("index weight_map does not match the tensors in the shards")
    return tensors, dtypes


# ----------------------------------------------------------------------------- model


def rope_inv_freq(config, head_dim):
    """inv_freq[i] = 1 / theta^(2i/d), with the llama3 adjustment when configured (float64)."""
    theta = float(config.get("rope_theta", 10000.0))
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    scaling = config.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "llama3":
            inv_freq = llama3_adjust(inv_freq, scaling)
        elif kind != "default":
            raise ValueError("unsupported rope_scaling %r" % (scaling,))
    return inv_freq


def llama3_adjust(inv_freq, scaling):
    """Llama 3.1 frequency-dependent RoPE scaling.

    Wavelengths shorter than original_max / high_freq_factor keep their frequency, those longer
    than original_max / low_freq_factor are slowed down by `factor`, and the band in between is
    interpolated linearly in original_max / wavelength.
    """
    factor = float(scaling["factor"])
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, interpolated, out)


def int8_rows(x):
    """x [..., head_dim] as an int8 KV cache holds it: each row (one token of one head) scaled by
    s = fp16(max |x| / 127), rounded half to even, clamped to +-127, times s."""
    scale = (x.abs().amax(-1, keepdim=True) / 127).to(torch.float16).to(torch.float64)
    q = torch.round(x / torch.where(scale > 0, scale, torch.ones_like(scale))).clamp(-127, 127)
    return q * scale


# The decoder layers' matrices, which Tandem's model.weight_quantization quantizes.
LINEAR_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def gptq_round_to_nearest(w, bits, group_size):
    """w [out, in] (float32) quantized and dequantized as GPTQ's symmetric Quantizer does it,
    per row and group of `group_size` input columns (<= 0: the whole row), with each scale
    rounded to fp16 as a GPTQ checkpoint stores it before the codes are computed:
      xmax = max(|min(w, 0)|, max(w, 0)), xmin = -xmax (both 0: -1 and 1)
      scale = (xmax - xmin) / (2^bits - 1), zero = 2^(bits - 1)
      q = clamp(round(w / scale) + zero, 0, 2^bits - 1)   (round half to even, in float32)
    Returns (q - zero) * scale in float64."""
    out, cols = w.shape
    g = cols if group_size <= 0 else group_size
    maxq = 2 ** bits - 1
    x = w.to(torch.float32).reshape(out, cols // g, g)
    xmin = torch.clamp(x.amin(-1), max=0)
    xmax = torch.clamp(x.amax(-1), min=0)
    xmax = torch.maximum(-xmin, xmax)
    xmin = -xmax
    both_zero = (xmin == 0) & (xmax == 0)
    xmin = torch.where(both_zero, torch.full_like(xmin, -1), xmin)
    xmax = torch.where(both_zero, torch.full_like(xmax, 1), xmax)
    scale = ((xmax - xmin) / maxq).to(torch.float16).to(torch.float32)[..., None]
    zero = (maxq + 1) // 2
    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
    return ((q.to(torch.float64) - zero) * scale.to(torch.float64)).reshape(out, cols)


def gptq_dequantize(tensors, prefix, bits, v2=False):
    """The float64 [out, in] weight of a GPTQ linear layer, from the format's definition
    (AutoGPTQ's QuantLinear packing): with pf = 32 / bits values per int32,
      qweight int32 [in / pf, out]: input k of output n at bits (k % pf) * bits of
          qweight[k // pf, n]
      qzeros int32 [groups, out / pf]: output n's zero at bits (n % pf) * bits of
          qzeros[g, n // pf], stored minus one (v1, read back as (stored + 1) & mask, as
          AutoGPTQ's own dequantization does; gptq_v2 stores the zero itself)
      scales [groups, out]; g_idx int32 [in]: the group of each input (any order: act-order)
    and w[n, k] = (code[k, n] - zero[g_idx[k], n]) * scale[g_idx[k], n]."""
    pf, mask = 32 // bits, (1 << bits) - 1
    qweight = tensors[prefix + ".qweight"].to(torch.int64)
    qzeros = tensors[prefix + ".qzeros"].to(torch.int64)
    scales = tensors[prefix + ".scales"].to(torch.float64)
    shifts = torch.arange(pf, dtype=torch.int64) * bits
    codes = ((qweight[:, None, :] >> shifts[None, :, None]) & mask).reshape(-1, qweight.shape[1])
    zeros = ((qzeros[:, :, None] >> shifts[None, None, :]) & mask).reshape(qzeros.shape[0], -1)
    if not v2:
        zeros = (zeros + 1) & mask
    g_idx = tensors[prefix + ".g_idx"].to(torch.int64)
    w = (codes.to(torch.float64) - zeros[g_idx].to(torch.float64)) * scales[g_idx]
    return w.T.contiguous()


# AWQ's GEMM packing puts outputs 0..7 of a word in nibbles 0, 2, 4, 6, 1, 3, 5, 7 (AutoAWQ's
# order_map); reading nibble AWQ_REVERSE_ORDER[j] gives output j.
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def awq_unpack(packed):
    """int32 [rows, words] -> int64 [rows, words * 8], the AWQ nibbles in output order."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    nibbles = (packed.to(torch.int64)[:, :, None] >> shifts) & 15  # [rows, words, 8] by nibble
    return nibbles[:, :, list(AWQ_REVERSE_ORDER)].reshape(packed.shape[0], -1)


def awq_dequantize(tensors, prefix, group_size):
    """The float64 [out, in] weight of an AWQ (GEMM) layer: qweight int32 [in, out / 8],
    qzeros int32 [in / group, out / 8] (zeros as they are), scales [in / group, out];
    w[n, k] = (code[k, n] - zero[k // group, n]) * scale[k // group, n]."""
    codes = awq_unpack(tensors[prefix + ".qweight"]).to(torch.float64)
    zeros = awq_unpack(tensors[prefix + ".qzeros"]).to(torch.float64)
    scales = tensors[prefix + ".scales"].to(torch.float64)
    g = torch.arange(codes.shape[0]) // group_size
    return ((codes - zeros[g]) * scales[g]).T.contiguous()


def ct_dequantize(tensors, prefix, bits, group_size):
    """The float64 [out, in] weight of a compressed-tensors layer: int-quantized stores
    weight int8 [out, in]; pack-quantized weight_packed int32 [out, ceil(in * bits / 32)], input
    k at bits (k % pf) * bits of word k // pf, stored plus 2^(bits - 1), and weight_shape.
    weight_scale [out, groups] ([out, 1] per channel), weight_zero_point int8 likewise when
    asymmetric, weight_g_idx [in] the group of each input (actorder):
    w[n, k] = (q[n, k] - zp[n, g]) * scale[n, g], g = g_idx[k] or k // group_size."""
    if prefix + ".weight_packed" in tensors:
        packed = tensors[prefix + ".weight_packed"].to(torch.int64)
        out, cols = [int(v) for v in tensors[prefix + ".weight_shape"].tolist()]
        pf = 32 // bits
        shifts = torch.arange(pf, dtype=torch.int64) * bits
        values = (packed[:, :, None] >> shifts) & ((1 << bits) - 1)
        q = values.reshape(out, -1)[:, :cols] - (1 << (bits - 1))
    else:
        q = tensors[prefix + ".weight"].to(torch.int64)
        out, cols = q.shape
    scale = tensors[prefix + ".weight_scale"].to(torch.float64)
    zp = tensors.get(prefix + ".weight_zero_point")
    zp = torch.zeros_like(scale) if zp is None else zp.to(torch.float64)
    if prefix + ".weight_g_idx" in tensors:
        g = tensors[prefix + ".weight_g_idx"].to(torch.int64)
    else:
        g = torch.arange(cols) // (group_size if group_size > 0 else cols)
    return (q.to(torch.float64) - zp[:, g]) * scale[:, g]


def dequantize_checkpoint(config, tensors):
    """Replaces a quantized checkpoint's tensors (GPTQ, AWQ, compressed-tensors) by the float
    weights they stand for."""
    q = config.get("quantization_config")
    if not q:
        return tensors
    method = q.get("quant_method")
    out = dict(tensors)
    if method == "gptq":
        suffixes, marker = (".qweight", ".qzeros", ".scales", ".g_idx"), ".qweight"
        deq = lambda p: gptq_dequantize(tensors, p, q["bits"],
                                        q.get("checkpoint_format") == "gptq_v2")
    elif method == "awq":
        suffixes, marker = (".qweight", ".qzeros", ".scales"), ".qweight"
        deq = lambda p: awq_dequantize(tensors, p, q.get("group_size", q.get("q_group_size")))
    elif method == "compressed-tensors":
        (scheme,) = q["config_groups"].values()
        w = scheme["weights"]
        group = w.get("group_size") or -1 if w.get("strategy") == "group" else -1
        suffixes = (".weight", ".weight_packed", ".weight_shape", ".weight_scale",
                    ".weight_zero_point", ".weight_g_idx")
        marker = ".weight_scale"
        deq = lambda p: ct_dequantize(tensors, p, w["num_bits"], group)
    else:
        raise ValueError("unsupported quant_method %r" % method)
    for name in list(tensors):
        if name.endswith(marker):
            prefix = name[:-len(marker)]
            weight = deq(prefix)
            for suffix in suffixes:
                out.pop(prefix + suffix, None)
            out[prefix + ".weight"] = weight
    return out


def int8_activations(config):
    """True when a compressed-tensors checkpoint quantizes the linears' inputs to int8 per token
    (W8A8, dynamic)."""
    q = config.get("quantization_config") or {}
    if q.get("quant_method") != "compressed-tensors":
        return False
    (scheme,) = q["config_groups"].values()
    return bool(scheme.get("input_activations"))


def int8_tokens(x):
    """x [..., in] rounded as W8A8's dynamic per-token quantization does before the product:
    s = max|x| / 127 per row, round(x / s) (half to even) times s."""
    s = x.abs().amax(-1, keepdim=True) / 127
    safe = torch.where(s > 0, s, torch.ones_like(s))
    return torch.round(x / safe) * s


def int8_blocks(x, block):
    """x [..., in] rounded as model.activation_quantization: int8 does: int8_tokens over each
    `block` consecutive columns (the last block may be shorter)."""
    return torch.cat([int8_tokens(part) for part in torch.split(x, block, dim=-1)], dim=-1)


class Reference:
    """Forward pass of a decoder-only HF model from a config dict and float32 weights.
    activation_block: round the decoder matrices' inputs to int8 in blocks of that many columns
    (model.activation_quantization: int8); a W8A8 checkpoint rounds per token regardless.
    bf16_inputs: round the inputs of the decoder matrices and lm_head to bf16 (as
    model.cpu_gemm: onednn multiplies bf16 weights); everything else stays float64.
    bf16_weights: round those matrices themselves to bf16 (as oneDNN multiplies f16 weights on
    a CPU with bf16 dot products), the embedding too when lm_head is tied to it.
    lm_head_quantization: (bits, group_size) quantizes lm_head as model.lm_head_quantization
    does (a tied embedding keeps its weights), its input rounded with activation_block too."""

    def __init__(self, config, weights, native=None, kv_dtype=None, weight_quantization=None,
                 activation_block=None, bf16_inputs=False, bf16_weights=False,
                 lm_head_quantization=None):
        self.config = config
        archs = config.get("architectures") or []
        self.model_type = config["model_type"]
        if self.model_type not in ("llama", "mistral", "qwen2", "qwen3"):
            raise ValueError("unsupported model_type %s (%s)" % (self.model_type, archs))
        self.hidden = config["hidden_size"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads") or self.heads
        self.head_dim = config.get("head_dim") or self.hidden // self.heads
        self.layers = config["num_hidden_layers"]
        self.eps = float(config["rms_norm_eps"])
        self.vocab = config["vocab_size"]
        self.sliding_window = None
        if self.model_type == "mistral" or config.get("use_sliding_window"):
            self.sliding_window = config.get("sliding_window")
        dtypes = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}
        self.native = dtypes[native]
        # Round K (after RoPE) and V as a KV cache of that dtype stores them: half precision, or
        # "int8" (Tandem's int8 cache: see int8_rows).
        self.kv_dtype = "int8" if kv_dtype == "int8" else dtypes[kv_dtype]
        self.w = {k: v.to(torch.float64) for k, v in weights.items()}
        # (bits, group_size): the decoder matrices as model.weight_quantization makes them.
        if weight_quantization is not None:
            bits, group = weight_quantization
            for i in range(self.layers):
                for name in LINEAR_NAMES:
                    key = "model.layers.%d.%s.weight" % (i, name)
                    self.w[key] = gptq_round_to_nearest(weights[key], bits, group)
        self.bf16_inputs = {"model.layers.", "lm_head"} if bf16_inputs else set()
        if "lm_head.weight" not in self.w:
            if not config.get("tie_word_embeddings", True):
                raise ValueError("lm_head.weight missing and embeddings are not tied")
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.rounded_inputs = ("model.layers.",)
        if lm_head_quantization is not None:
            self.w["lm_head.weight"] = gptq_round_to_nearest(self.w["lm_head.weight"],
                                                             *lm_head_quantization)
            self.rounded_inputs += ("lm_head",)
        if bf16_weights:
            def bf16(t):
                return t.to(torch.bfloat16).to(torch.float64)
            for i in range(self.layers):
                for name in LINEAR_NAMES:
                    key = "model.layers.%d.%s.weight" % (i, name)
                    self.w[key] = bf16(self.w[key])
            if self.w["lm_head.weight"] is self.w["model.embed_tokens.weight"]:
                self.w["model.embed_tokens.weight"] = bf16(self.w["model.embed_tokens.weight"])
                self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
            else:
                self.w["lm_head.weight"] = bf16(self.w["lm_head.weight"])
        self.inv_freq = rope_inv_freq(config, self.head_dim)
        self.int8_inputs = int8_activations(config)
        self.activation_block = activation_block

    @classmethod
    def from_dir(cls, model_dir, native=None, kv_dtype=None, weight_quantization=None,
                 activation_block=None, bf16_inputs=False, bf16_weights=False,
                 lm_head_quantization=None):
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
        weights, _ = load_weights(model_dir)
        weights = dequantize_checkpoint(config, weights)
        return cls(config, weights, native=native, kv_dtype=kv_dtype,
                   weight_quantization=weight_quantization, activation_block=activation_block,
                   bf16_inputs=bf16_inputs, bf16_weights=bf16_weights,
                   lm_head_quantization=lm_head_quantization)

    # Rounds to the native dtype (no-op in reference mode).
    def _r(self, x):
        if self.native is None:
            return x
        return x.to(self.native).to(torch.float64)

    def _rms_norm(self, x, weight):
        if self.native is not None:  # HF: statistics in float32, product in the model dtype.
            x32 = x.to(torch.float32)
            normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
            return self._r(weight * self._r(normed.to(torch.float64)))
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed * weight

    def _linear(self, x, name, bias=False):
        if self.int8_inputs and name.startswith("model.layers."):
            x = int8_tokens(x)
        elif self.activation_block and name.startswith(self.rounded_inputs):
            x = int8_blocks(x, self.activation_block)
        if any(name.startswith(p) for p in self.bf16_inputs):
            x = x.to(torch.bfloat16).to(torch.float64)
        y = x @ self.w[name + ".weight"].T
        if bias:
            y = self._r(y) + self.w[name + ".bias"]
        return self._r(y)

    def _rope(self, x, positions):
        """x: [heads, n, head_dim]; rotate_half convention (first half / second half pairs)."""
        angles = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([angles, angles], dim=-1)
        cos, sin = self._r(emb.cos()), self._r(emb.sin())
        half = self.head_dim // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return self._r(self._r(x * cos) + self._r(rotated * sin))

    def _attention(self, x, i, positions, kv_keep=None, trace=None):
        p = "model.layers.%d.self_attn." % i
        n = x.shape[0]
        bias = self.model_type == "qwen2"
        q = self._linear(x, p + "q_proj", bias).view(n, self.heads, self.head_dim)
        k = self._linear(x, p + "k_proj", bias).view(n, self.kv_heads, self.head_dim)
        v = self._linear(x, p + "v_proj", bias).view(n, self.kv_heads, self.head_dim)
        if self.model_type == "qwen3":  # Per-head RMSNorm of q and k before RoPE.
            q = self._rms_norm(q, self.w[p + "q_norm.weight"])
            k = self._rms_norm(k, self.w[p + "k_norm.weight"])
        q = self._rope(q.transpose(0, 1), positions)
        k = self._rope(k.transpose(0, 1), positions)
        v = v.transpose(0, 1)
        if kv_keep is not None:  # Ablation: rows whose K/V were never written (zero).
            k = k * kv_keep[None, :, None]
            v = v * kv_keep[None, :, None]
        if self.kv_dtype == "int8":
            k, v = int8_rows(k), int8_rows(v)
        elif self.kv_dtype is not None:
            k = k.to(self.kv_dtype).to(torch.float64)
            v = v.to(self.kv_dtype).to(torch.float64)
        if trace is not None:  # [n, heads, head_dim] after RoPE (and any KV rounding)
            trace["q"].append(q.transpose(0, 1))
            trace["k"].append(k.transpose(0, 1))
            trace["v"].append(v.transpose(0, 1))
        group = self.heads // self.kv_heads  # Query head h reads kv head h // group.
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        scores = self._r(self._r(q @ k.transpose(1, 2)) / math.sqrt(self.head_dim))
        distance = positions[:, None] - positions[None, :]
        allowed = distance >= 0
        if self.sliding_window:
            allowed &= distance < self.sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if self.native is not None:
            probs = self._r(torch.softmax(scores.to(torch.float32), dim=-1).to(torch.float64))
        else:
            probs = torch.softmax(scores, dim=-1)
        out = self._r(probs @ v).transpose(0, 1).reshape(n, self.heads * self.head_dim)
        out = self._linear(out, p + "o_proj")
        if trace is not None:
            trace["attention"].append(out)
        return out

    def _mlp(self, x, i):
        p = "model.layers.%d.mlp." % i
        gate = self._linear(x, p + "gate_proj")
        up = self._linear(x, p + "up_proj")
        act = self._r(self._r(torch.nn.functional.silu(gate)) * up)
        return self._linear(act, p + "down_proj")

    def hidden_states(self, token_ids, start_pos=0, pruned_layers=(), full_depth=None,
                      independent_kv=True, trace=None, gates=None):
        """Final-norm hidden states [n, hidden] for tokens at positions start_pos, ...

        Prefill-only pruning (POP): in the layers of `pruned_layers`, only the positions where
        `full_depth` is true take the attention and MLP updates; every position's K/V still
        comes from the hidden state that reaches the layer (the attention below computes K/V
        for all rows, and a full-depth row attends to all of them). With independent_kv=False
        (POP's ablation) the pruned positions' K/V in pruned layers are zero instead.

        `trace`, a dict, receives per layer: "inputs" (the hidden state entering it), "q", "k",
        "v" ([n, heads, head_dim] after RoPE) and "attention" (the o_proj output; for pruned
        positions of a pruned layer, computed but not applied).

        `gates` (POP's virtual gates): per layer, a tensor [n] of factors on that layer's
        attention and MLP outputs for each position (differentiable)."""
        if trace is not None:
            for key in ("inputs", "q", "k", "v", "attention"):
                trace[key] = []
        ids = torch.as_tensor(list(token_ids), dtype=torch.long)
        positions = torch.arange(start_pos, start_pos + len(ids), dtype=torch.long)
        x = self.w["model.embed_tokens.weight"][ids]
        for i in range(self.layers):
            p = "model.layers.%d." % i
            keep, kv_keep = None, None
            if i in pruned_layers:
                keep = torch.as_tensor(list(full_depth), dtype=torch.bool)[:, None]
                if not independent_kv:
                    kv_keep = keep[:, 0].to(torch.float64)
            if trace is not None:
                trace["inputs"].append(x)
            h = self._rms_norm(x, self.w[p + "input_layernorm.weight"])
            branch = self._attention(h, i, positions, kv_keep, trace)
            if gates is not None:
                branch = branch * gates[i][:, None]
            updated = self._r(x + branch)
            x = updated if keep is None else torch.where(keep, updated, x)
            h = self._rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            branch = self._mlp(h, i)
            if gates is not None:
                branch = branch * gates[i][:, None]
            updated = self._r(x + branch)
            x = updated if keep is None else torch.where(keep, updated, x)
        return self._rms_norm(x, self.w["model.norm.weight"])

    def logits(self, token_ids, start_pos=0, pruned_layers=(), full_depth=None,
               independent_kv=True):
        """Logits of every position, float64 numpy array [n, vocab]."""
        with torch.no_grad():
            h = self.hidden_states(token_ids, start_pos, pruned_layers, full_depth,
                                   independent_kv)
            return self._linear(h, "lm_head").numpy()

    def greedy(self, prompt_ids, steps):
        """Greedy continuation: the `steps` new ids."""
        return self.greedy_with_margins(prompt_ids, steps)[0]

    def greedy_with_margins(self, prompt_ids, steps):
        """Greedy continuation (full recompute per step): (new ids, top-1 minus top-2 margins)."""
        seq, out, margins = list(prompt_ids), [], []
        for _ in range(steps):
            last = self.logits(seq)[-1]
            top2 = np.argsort(last)[-2:]
            out.append(int(top2[1]))
            margins.append(float(last[top2[1]] - last[top2[0]]))
            seq.append(out[-1])
        return out, margins


# ----------------------------------------------------------------------------- self-test


def _tiny_config(**overrides):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
         "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "rope_scaling": None, "vocab_size": 50, "tie_word_embeddings": False}
    c.update(overrides)
    return c


def _random_weights(c, seed=0):
    g = torch.Generator().manual_seed(seed)
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    qo, kvo = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    std = 1.5 / math.sqrt(h)

    def mat(*shape):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1 + 0.1 * torch.randn(n, generator=g)

    w = {"model.embed_tokens.weight": mat(v, h), "model.norm.weight": norm(h),
         "lm_head.weight": mat(v, h)}
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        w.update({p + "self_attn.q_proj.weight": mat(qo, h), p + "self_attn.k_proj.weight":
                  mat(kvo, h), p + "self_attn.v_proj.weight": mat(kvo, h),
                  p + "self_attn.o_proj.weight": mat(h, qo), p + "mlp.gate_proj.weight":
                  mat(f, h), p + "mlp.up_proj.weight": mat(f, h), p + "mlp.down_proj.weight":
                  mat(h, f), p + "input_layernorm.weight": norm(h),
                  p + "post_attention_layernorm.weight": norm(h)})
        if c["model_type"] == "qwen2":
            for n, o in (("q", qo), ("k", kvo), ("v", kvo)):
                w[p + "self_attn.%s_proj.bias" % n] = 0.2 * torch.randn(o, generator=g)
        if c["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
    return w


def _check(results, name, ok, detail):
    results.append(ok)
    print("  %-4s %-52s %s" % ("ok" if ok else "FAIL", name, detail))


def _selftest_llama3_inv_freq(results):
    # Hand computation for theta 500000, head_dim 16, factor 32, low 1, high 4, original 64:
    # wavelengths 2*pi*500000^(i/8); low_freq_wavelen 64, high_freq_wavelen 16.
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    got = rope_inv_freq({"rope_theta": 500000.0, "rope_scaling": scaling}, 16).tolist()
    want = []
    for i in range(8):
        f = 500000.0 ** (-i / 8.0)
        wl = 2 * math.pi / f
        if wl < 16:
            want.append(f)
        elif wl > 64:
            want.append(f / 32)
        else:
            s = (64 / wl - 1) / 3
            want.append((1 - s) * f / 32 + s * f)
    # Spot values computed by hand: i=0 high-freq (unchanged), i=1 in the smooth band,
    # i=2 low-freq (divided by 32).
    f1 = 500000.0 ** -0.125
    s1 = (64 * f1 / (2 * math.pi) - 1) / 3
    hand = {0: 1.0, 1: (1 - s1) * f1 / 32 + s1 * f1, 2: 500000.0 ** -0.25 / 32}
    err = max(abs(a - b) / b for a, b in zip(got, want))
    hand_err = max(abs(got[i] - v) / v for i, v in hand.items())
    _check(results, "llama3 inv_freq vs hand computation", err < 1e-12 and hand_err < 1e-12,
           "rel err %.1e / %.1e, band i=1 smooth=%.3f" % (err, hand_err, s1))
    scaling_1b = dict(scaling, original_max_position_embeddings=8192)
    got = rope_inv_freq({"rope_theta": 500000.0, "rope_scaling": scaling_1b}, 64)
    plain = rope_inv_freq({"rope_theta": 500000.0}, 64)
    ratio = (plain / got).tolist()
    # Llama-3.2-1B: wavelength 2*pi*500000^(i/32) crosses 2048 at i~14.1 and 8192 at i~17.5,
    # so frequencies 0..14 are kept, 15..17 interpolated and 18..31 divided by 32.
    ok = (all(abs(r - 1) < 1e-12 for r in ratio[:15]) and
          all(abs(r - 32) < 1e-9 for r in ratio[18:]) and
          all(1 < r < 32 for r in ratio[15:18]) and ratio[15] < ratio[16] < ratio[17])
    _check(results, "llama3 inv_freq bands at Llama-3.2-1B settings", ok,
           "ratios[14:19]=%s" % ["%.2f" % r for r in ratio[14:19]])


def _selftest_model(results, name, config):
    ref = Reference(config, _random_weights(config))
    rng = np.random.RandomState(1)
    ids = rng.randint(0, config["vocab_size"], size=24).tolist()
    full = ref.logits(ids)
    prefix = ref.logits(ids[:10])
    d = np.abs(full[:10] - prefix).max()
    _check(results, name + ": prefix logits = rows of full logits", d < 1e-12,
           "max diff %.1e" % d)
    # RoPE encodes relative positions only: shifting all positions leaves logits unchanged
    # (without llama3 scaling the check is exact up to float64 rounding of the angles).
    shifted = ref.logits(ids, start_pos=37)
    _check(results, name + ": logits invariant to position shift",
           np.abs(full - shifted).max() < 1e-9, "max diff %.1e" % np.abs(full - shifted).max())
    _check(results, name + ": logits well spread (std >= 1)", full.std() >= 1.0,
           "std %.2f" % full.std())
    return ref, ids, full


def _selftest_gqa_as_mha(results):
    config = _tiny_config(num_key_value_heads=2)
    w = _random_weights(config, seed=3)
    ref = Reference(config, w)
    mha_config = dict(config, num_key_value_heads=4)
    mha_w = dict(w)
    hd, group = 8, 2
    for i in range(config["num_hidden_layers"]):
        for n in ("k", "v"):
            key = "model.layers.%d.self_attn.%s_proj.weight" % (i, n)
            heads = w[key].view(2, hd, -1)
            mha_w[key] = heads.repeat_interleave(group, dim=0).reshape(4 * hd, -1)
    mha = Reference(mha_config, mha_w)
    ids = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6]
    d = np.abs(ref.logits(ids) - mha.logits(ids)).max()
    _check(results, "GQA = MHA with kv heads duplicated", d < 1e-12, "max diff %.1e" % d)
    # And the grouping matters: pairing query heads with the wrong kv head changes logits.
    wrong_w = dict(mha_w)
    for i in range(config["num_hidden_layers"]):
        for n in ("k", "v"):
            key = "model.layers.%d.self_attn.%s_proj.weight" % (i, n)
            heads = w[key].view(2, hd, -1)
            wrong_w[key] = heads.repeat(group, 1, 1).reshape(4 * hd, -1)
    d_wrong = np.abs(ref.logits(ids) - Reference(mha_config, wrong_w).logits(ids)).max()
    _check(results, "GQA with tiled (wrong) kv grouping differs", d_wrong > 1e-2,
           "max diff %.2f" % d_wrong)


def _selftest_sensitivity(results):
    """Bugs the parity test must catch move logits far beyond its 1e-3 * std tolerance."""
    rng = np.random.RandomState(2)
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    base = _tiny_config(rope_theta=500000.0, rope_scaling=scaling, rms_norm_eps=1e-2)
    ids = rng.randint(0, 50, size=40).tolist()
    w = _random_weights(base, seed=5)
    good = Reference(base, w).logits(ids)
    tol = 1e-3 * good.std()

    class InterleavedRope(Reference):  # GPT-J pairing (2i, 2i+1) instead of (i, i + d/2).
        def _rope(self, x, positions):
            perm = torch.arange(self.head_dim).view(2, -1).T.reshape(-1)
            return super()._rope(x[..., perm], positions)[..., torch.argsort(perm)]

    variants = {
        "rope_scaling ignored": Reference(dict(base, rope_scaling=None), w),
        "rope interleaved pairs": InterleavedRope(base, w),
        # eps only shows when it is not negligible against mean(x^2) (~0.07 for embeddings).
        "rms_eps 1e-8 vs 1e-2": Reference(dict(base, rms_norm_eps=1e-8), w),
    }
    for label, ref in variants.items():
        d = np.abs(ref.logits(ids) - good).max()
        _check(results, "sensitivity: " + label, d > 10 * tol, "diff/tol %.1f" % (d / tol))
    q3 = _tiny_config(model_type="qwen3", head_dim=16)
    wq = _random_weights(q3, seed=6)
    good = Reference(q3, wq).logits(ids)
    no_qk_norm = dict(wq)
    for i in range(2):
        for n in ("q", "k"):
            no_qk_norm["model.layers.%d.self_attn.%s_norm.weight" % (i, n)] = torch.ones(16)
    d = np.abs(Reference(q3, no_qk_norm).logits(ids) - good).max()
    _check(results, "sensitivity: qwen3 q/k norm weights = 1",
           d > 10e-3 * good.std(), "diff/tol %.1f" % (d / (1e-3 * good.std())))


def _selftest_native(results):
    config = _tiny_config(num_hidden_layers=2)
    w = {k: v.to(torch.bfloat16).to(torch.float32) for k, v in _random_weights(config).items()}
    ids = list(range(1, 41))
    exact = Reference(config, w).logits(ids)
    for dt in ("bf16", "fp16"):
        native = Reference(config, w, native=dt).logits(ids)
        rel = np.abs(native - exact).max() / exact.std()
        _check(results, "native %s emulation deviates moderately" % dt, 1e-5 < rel < 0.2,
               "max|diff|/std %.2e" % rel)


def _selftest_files(results, make_model, workdir):
    import subprocess
    import tempfile
    tmp = tempfile.mkdtemp(dir=workdir)
    one, three = os.path.join(tmp, "one"), os.path.join(tmp, "three")
    common = [make_model, "--arch", "qwen2", "--dtype", "bf16", "--seed", "9", "--layers", "3"]
    subprocess.run(common + ["--out", one], check=True)
    subprocess.run(common + ["--out", three, "--shards", "3"], check=True)
    a, da = load_weights(one)
    b, _ = load_weights(three)
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    _check(results, "make-random-model: 3 shards = 1 file", same, "%d tensors" % len(a))
    # Cross-check the bf16 decoding against torch's own bfloat16 conversion.
    emb = a["model.embed_tokens.weight"]
    _check(results, "bf16 decode exact", torch.equal(emb, emb.to(torch.bfloat16).float()),
           "dtype %s" % da["model.embed_tokens.weight"])
    with open(os.path.join(three, "model.safetensors.index.json")) as f:
        total = json.load(f)["metadata"]["total_size"]
    want = sum(t.numel() * 2 for t in a.values())
    _check(results, "index total_size", total == want, "%d bytes" % total)
    with open(os.path.join(one, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    _check(results, "safetensors data 8-byte aligned", (8 + n) % 8 == 0, "header %d" % n)
    ref = Reference.from_dir(one)
    stats = {k: float(v.std()) for k, v in a.items()}
    mean_norm = float(a["model.norm.weight"].mean())
    up_std = stats["model.layers.0.mlp.up_proj.weight"]
    _check(results, "make-random-model init (norm ~1, matrices ~1.5/sqrt(h))",
           abs(mean_norm - 1) < 0.05 and abs(up_std - 1.5 / 8) < 0.01,
           "norm mean %.3f, up_proj std %.4f" % (mean_norm, up_std))
    logits = ref.logits(list(range(3, 43)))
    _check(results, "make-random-model tiny logits std >= 1", logits.std() >= 1.0,
           "std %.2f" % logits.std())


def selftest(make_model=None, workdir=None):
    results = []
    print("hf_reference self-test")
    _selftest_llama3_inv_freq(results)
    _selftest_model(results, "llama GQA", _tiny_config())
    _selftest_model(results, "qwen2", _tiny_config(model_type="qwen2"))
    _selftest_model(results, "qwen3 head_dim 16", _tiny_config(model_type="qwen3", head_dim=16))
    _selftest_model(results, "mistral MQA", _tiny_config(model_type="mistral",
                                                         num_key_value_heads=1))
    _selftest_gqa_as_mha(results)
    _selftest_sensitivity(results)
    _selftest_native(results)
    if make_model:
        os.makedirs(workdir, exist_ok=True)
        _selftest_files(results, make_model, workdir)
    print("self-test: %d/%d passed" % (sum(results), len(results)))
    return all(results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--selftest", action="store_true")
    parser.add_argument("--make-model", help="make-random-model binary (file checks)")
    parser.add_argument("--workdir", default="/tmp/hf_reference_selftest")
    parser.add_argument("--model", help="model directory: print logits / greedy ids")
    parser.add_argument("--tokens", default="1,2,3")
    parser.add_argument("--greedy", type=int, default=0)
    parser.add_argument("--native", choices=["bf16", "fp16"])
    args = parser.parse_args()
    if args.selftest:
        return 0 if selftest(args.make_model, args.workdir) else 1
    if not args.model:
        parser.error("--selftest or --model is required")
    ref = Reference.from_dir(args.model, native=args.native)
    ids = [int(t) for t in args.tokens.split(",")]
    if args.greedy:
        print(",".join(str(t) for t in ref.greedy(ids, args.greedy)))
    else:
        np.set_printoptions(precision=4, suppress=True)
        print(ref.logits(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
