#!/usr/bin/python3
"""Writes a Tandem / Hugging Face Llama checkpoint as a GGUF v3 file that llama.cpp loads.

Used to benchmark Tandem against llama.cpp on the same (usually random) weights at the same
number of bits:

  /usr/bin/python3 bench/llama_cpp/write_gguf.py --model DIR --out FILE.gguf --type q8_0|q4_0|f16|bf16
      [--output-type f16|q8_0]

DIR holds config.json and model.safetensors (or model.safetensors.index.json with shards), in
f32, f16 or bf16. Only the 7 linear matrices of each decoder layer take --type; the token
embedding (and lm_head when it is not tied) is written as F16, as Tandem keeps them in 16 bits,
and the RMSNorm weights as F32. --output-type q8_0 writes lm_head as a Q8_0 output.weight, tied
or not (as Tandem's model.lm_head_quantization: int8 quantizes it; llama.cpp multiplies
output.weight where the file has one). The q/k projection rows are permuted from the Hugging Face
rotate-half RoPE layout into the interleaved-pair layout llama.cpp's "llama" architecture uses,
so the GGUF computes the same function as the checkpoint. Llama 3 rope scaling is written as a
rope_freqs.weight tensor of per-pair frequency divisors.

The tokenizer is a placeholder llama.cpp accepts (tokenizer.ggml.model "llama"): 256 byte
tokens, then "<tok_N>" strings. It is for feeding token ids, not text.

Quantization follows ggml's reference quantizers: Q8_0 blocks of 32 with an f16 scale
d = amax/127 and q = round(x/d); Q4_0 blocks of 32 with d = max/-8 (max: the signed value of
largest magnitude) and q = min(15, trunc(x/d + 8.5)), element j in the low nibble and j+16 in
the high nibble of byte j.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np

# GGUF metadata value types.
GGUF_UINT8, GGUF_INT8, GGUF_UINT16, GGUF_INT16 = 0, 1, 2, 3
GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL = 4, 5, 6, 7
GGUF_STRING, GGUF_ARRAY, GGUF_UINT64, GGUF_INT64, GGUF_FLOAT64 = 8, 9, 10, 11, 12

# ggml tensor types.
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 8, 30
# llama_ftype ("general.file_type"): mostly F16 = 1, mostly Q4_0 = 2, mostly Q8_0 = 7,
# mostly BF16 = 32.
FILE_TYPE = {"f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}
LINEAR_TYPE = {"f16": GGML_F16, "q4_0": GGML_Q4_0, "q8_0": GGML_Q8_0, "bf16": GGML_BF16}

ALIGNMENT = 32
QK = 32  # elements per Q4_0 / Q8_0 block


# ---------------------------------------------------------------------------------------------
# safetensors reading (no dependency on the safetensors package)

class SafetensorsFile:
    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n))
        self.header.pop("__metadata__", None)
        self.data_start = 8 + n
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")

    def names(self):
        return list(self.header)

    def get_f32(self, name):
        """The tensor as a float32 numpy array of its shape."""
        info = self.header[name]
        begin, end = info["data_offsets"]
        raw = self.mm[self.data_start + begin:self.data_start + end]
        shape = info["shape"]
        dt = info["dtype"]
        if dt == "F32":
            a = raw.view(np.float32).astype(np.float32)
        elif dt == "F16":
            a = raw.view(np.float16).astype(np.float32)
        elif dt == "BF16":
            a = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{name}: unsupported dtype {dt} (want F32, F16 or BF16)")
        return a.reshape(shape)


class Checkpoint:
    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        self.files = {}
        self.where = {}
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            for name, fname in weight_map.items():
                if fname not in self.files:
                    self.files[fname] = SafetensorsFile(os.path.join(model_dir, fname))
                self.where[name] = self.files[fname]
        else:
            st = SafetensorsFile(os.path.join(model_dir, "model.safetensors"))
            for name in st.names():
                self.where[name] = st

    def has(self, name):
        return name in self.where

    def get(self, name):
        if name not in self.where:
            raise SystemExit(f"checkpoint has no tensor {name}")
        return self.where[name].get_f32(name)


# ---------------------------------------------------------------------------------------------
# Quantizers (numpy-vectorized over all blocks of a tensor)

def round_half_away(x):
    """C roundf: halves round away from zero (numpy's rint rounds them to even)."""
    r = np.rint(x)
    tie = np.abs(x - r) == 0.5  # exact in float32 for |x| < 2^22
    if tie.any():
        r[tie] = x[tie] + np.copysign(0.5, x[tie])
    return r


def quantize_q8_0(w):
    """[rows, cols] float32 -> bytes of rows*cols/32 blocks (f16 d, 32 x int8)."""
    blocks = w.reshape(-1, QK).astype(np.float32)
    amax = np.abs(blocks).max(axis=1)
    d = amax / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = round_half_away(blocks * inv[:, None]).astype(np.int8)
    out = np.empty((blocks.shape[0], 2 + QK), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quantize_q4_0(w):
    """[rows, cols] float32 -> bytes of rows*cols/32 blocks (f16 d, 16 bytes of nibbles)."""
    blocks = w.reshape(-1, QK).astype(np.float32)
    idx = np.abs(blocks).argmax(axis=1)
    mx = blocks[np.arange(blocks.shape[0]), idx]
    d = mx / -8.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    x = blocks * inv[:, None] + 8.5
    # C's (int8_t) cast truncates toward zero; x >= 0.5 here up to rounding, so clip at 0 first.
    q = np.minimum(15, np.trunc(np.maximum(x, 0.0))).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    out = np.empty((blocks.shape[0], 2 + QK // 2), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = packed
    return out.tobytes()


def encode(w, ggml_type):
    if ggml_type == GGML_F32:
        return np.ascontiguousarray(w, dtype=np.float32).tobytes()
    if ggml_type == GGML_F16:
        return np.ascontiguousarray(w, dtype=np.float16).tobytes()
    if ggml_type == GGML_BF16:  # round to nearest even (exact for weights stored as bf16)
        u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
    if w.shape[-1] % QK != 0:
        raise SystemExit(f"row length {w.shape[-1]} is not a multiple of {QK}")
    if ggml_type == GGML_Q8_0:
        return quantize_q8_0(w)
    if ggml_type == GGML_Q4_0:
        return quantize_q4_0(w)
    raise ValueError(ggml_type)


# ---------------------------------------------------------------------------------------------
# Model mapping

def permute_rope_rows(w, n_heads):
    """HF stores each head's rows as [first halves of the pairs | second halves]; llama.cpp's
    llama graph rotates adjacent pairs, so interleave the two halves row-wise."""
    rows = w.shape[0]
    hd = rows // n_heads
    return (w.reshape(n_heads, 2, hd // 2, *w.shape[1:])
             .swapaxes(1, 2)
             .reshape(w.shape))


def llama3_rope_factors(cfg, head_dim):
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind != "llama3":
        return None
    theta = float(cfg.get("rope_theta", 10000.0))
    factor = float(rs.get("factor", 8.0))
    low = float(rs.get("low_freq_factor", 1.0))
    high = float(rs.get("high_freq_factor", 4.0))
    old_len = float(rs.get("original_max_position_embeddings", 8192))
    low_wavelen = old_len / low
    high_wavelen = old_len / high
    out = []
    for i in range(head_dim // 2):
        f = 1.0 / theta ** (2.0 * i / head_dim)
        wavelen = 2 * math.pi / f
        if wavelen > low_wavelen:
            scaled = f / factor
        elif wavelen >= high_wavelen:
            smooth = (old_len / wavelen - low) / (high - low)
            scaled = (1 - smooth) * f / factor + smooth * f
        else:
            scaled = f
        out.append(f / scaled)  # llama.cpp divides the pair's frequency by this
    return np.array(out, dtype=np.float32)


def first_id(v, default):
    if v is None:
        return default
    if isinstance(v, list):
        return int(v[0]) if v else default
    return int(v)


# ---------------------------------------------------------------------------------------------
# GGUF writing

class GgufWriter:
    def __init__(self):
        self.kv = []        # (key, type, payload bytes)
        self.tensors = []   # (name, ne list (innermost first), ggml type, data producer, nbytes)

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def add(self, key, vtype, value):
        if vtype == GGUF_STRING:
            payload = self._str(value)
        elif vtype == GGUF_UINT32:
            payload = struct.pack("<I", value)
        elif vtype == GGUF_INT32:
            payload = struct.pack("<i", value)
        elif vtype == GGUF_FLOAT32:
            payload = struct.pack("<f", value)
        elif vtype == GGUF_BOOL:
            payload = struct.pack("<?", value)
        else:
            raise ValueError(vtype)
        self.kv.append((key, vtype, payload))

    def add_array(self, key, elem_type, values):
        n = len(values)
        head = struct.pack("<IQ", elem_type, n)
        if elem_type == GGUF_STRING:
            body = b"".join(self._str(v) for v in values)
        elif elem_type == GGUF_FLOAT32:
            body = np.asarray(values, dtype="<f4").tobytes()
        elif elem_type == GGUF_INT32:
            body = np.asarray(values, dtype="<i4").tobytes()
        else:
            raise ValueError(elem_type)
        self.kv.append((key, GGUF_ARRAY, head + body))

    def add_tensor(self, name, hf_shape, ggml_type, produce):
        """hf_shape: row-major numpy shape; GGUF lists dims innermost first."""
        ne = list(reversed(hf_shape))
        n = int(np.prod(hf_shape))
        if ggml_type == GGML_F32:
            nbytes = 4 * n
        elif ggml_type in (GGML_F16, GGML_BF16):
            nbytes = 2 * n
        elif ggml_type == GGML_Q8_0:
            nbytes = n // QK * 34
        elif ggml_type == GGML_Q4_0:
            nbytes = n // QK * 18
        self.tensors.append((name, ne, ggml_type, produce, nbytes))

    def write(self, path, log):
        def pad(n):
            return (ALIGNMENT - n % ALIGNMENT) % ALIGNMENT

        offsets = []
        off = 0
        for (_, _, _, _, nbytes) in self.tensors:
            offsets.append(off)
            off += nbytes + pad(nbytes)

        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"GGUF")
            f.write(struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
            for key, vtype, payload in self.kv:
                f.write(self._str(key))
                f.write(struct.pack("<I", vtype))
                f.write(payload)
            for (name, ne, gtype, _, _), o in zip(self.tensors, offsets):
                f.write(self._str(name))
                f.write(struct.pack("<I", len(ne)))
                f.write(struct.pack(f"<{len(ne)}Q", *ne))
                f.write(struct.pack("<IQ", gtype, o))
            f.write(b"\0" * pad(f.tell()))
            data_start = f.tell()
            for i, ((name, ne, gtype, produce, nbytes), o) in enumerate(zip(self.tensors, offsets)):
                assert f.tell() - data_start == o
                data = produce()
                if len(data) != nbytes:
                    raise SystemExit(f"{name}: produced {len(data)} bytes, expected {nbytes}")
                f.write(data)
                f.write(b"\0" * pad(nbytes))
                log(i + 1, len(self.tensors), name)
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory (config.json, safetensors)")
    ap.add_argument("--out", required=True, help="GGUF file to write")
    ap.add_argument("--type", required=True, choices=sorted(FILE_TYPE),
                    help="type of the decoder layers' linear matrices")
    ap.add_argument("--output-type", choices=("f16", "q8_0"), default="f16",
                    help="type of lm_head (output.weight; q8_0 writes it even when tied)")
    ap.add_argument("--context-length", type=int, default=None,
                    help="llama.context_length (default: max_position_embeddings)")
    args = ap.parse_args()

    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    arch = cfg.get("model_type", "llama")
    if arch not in ("llama", "mistral"):
        raise SystemExit(f"model_type {arch!r}: only llama-style checkpoints are supported")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise SystemExit("biases are not supported")

    hidden = int(cfg["hidden_size"])
    n_layers = int(cfg["num_hidden_layers"])
    n_heads = int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_heads)
    head_dim = int(cfg.get("head_dim") or hidden // n_heads)
    ffn = int(cfg["intermediate_size"])
    vocab = int(cfg["vocab_size"])
    eps = float(cfg.get("rms_norm_eps", 1e-5))
    theta = float(cfg.get("rope_theta", 10000.0))
    ctx = int(args.context_length or cfg.get("max_position_embeddings", 2048))
    rs = cfg.get("rope_scaling") or {}
    rs_kind = rs.get("rope_type", rs.get("type"))
    if rs_kind not in (None, "default", "llama3"):
        raise SystemExit(f"rope_scaling {rs_kind!r} is not supported (none or llama3)")

    ckpt = Checkpoint(args.model)
    tied = not ckpt.has("lm_head.weight")
    if cfg.get("tie_word_embeddings") and not tied:
        print("note: tie_word_embeddings is set but lm_head.weight exists; writing output.weight")

    bos = first_id(cfg.get("bos_token_id"), 1)
    eos = first_id(cfg.get("eos_token_id"), 2)
    if os.path.exists(os.path.join(args.model, "generation_config.json")):
        with open(os.path.join(args.model, "generation_config.json")) as f:
            gen = json.load(f)
        bos = first_id(gen.get("bos_token_id"), bos)
        eos = first_id(gen.get("eos_token_id"), eos)

    w = GgufWriter()
    w.add("general.architecture", GGUF_STRING, "llama")
    w.add("general.name", GGUF_STRING, os.path.basename(os.path.abspath(args.model)))
    w.add("general.alignment", GGUF_UINT32, ALIGNMENT)
    w.add("general.file_type", GGUF_UINT32, FILE_TYPE[args.type])
    w.add("llama.context_length", GGUF_UINT32, ctx)
    w.add("llama.embedding_length", GGUF_UINT32, hidden)
    w.add("llama.block_count", GGUF_UINT32, n_layers)
    w.add("llama.feed_forward_length", GGUF_UINT32, ffn)
    w.add("llama.attention.head_count", GGUF_UINT32, n_heads)
    w.add("llama.attention.head_count_kv", GGUF_UINT32, n_kv)
    w.add("llama.rope.freq_base", GGUF_FLOAT32, theta)
    w.add("llama.attention.layer_norm_rms_epsilon", GGUF_FLOAT32, eps)
    w.add("llama.rope.dimension_count", GGUF_UINT32, head_dim)
    w.add("llama.vocab_size", GGUF_UINT32, vocab)
    if head_dim * n_heads != hidden:
        w.add("llama.attention.key_length", GGUF_UINT32, head_dim)
        w.add("llama.attention.value_length", GGUF_UINT32, head_dim)

    # Placeholder SentencePiece-style vocabulary: byte tokens first, then unique strings.
    if vocab < 256 + 1:
        raise SystemExit("vocab_size must exceed 256 (the byte tokens)")
    tokens = [f"<0x{i:02X}>" for i in range(256)] + [f"<tok_{i}>" for i in range(256, vocab)]
    types = [6] * 256 + [1] * (vocab - 256)  # 6: byte, 1: normal, 3: control
    for tid, text in ((bos, "<s>"), (eos, "</s>")):
        if 0 <= tid < vocab:
            if tid < 256:
                print(f"note: special id {tid} overrides byte token {tokens[tid]}")
            tokens[tid] = text
            types[tid] = 3
    scores = [0.0] * vocab
    w.add("tokenizer.ggml.model", GGUF_STRING, "llama")
    w.add_array("tokenizer.ggml.tokens", GGUF_STRING, tokens)
    w.add_array("tokenizer.ggml.scores", GGUF_FLOAT32, scores)
    w.add_array("tokenizer.ggml.token_type", GGUF_INT32, types)
    w.add("tokenizer.ggml.bos_token_id", GGUF_UINT32, bos)
    w.add("tokenizer.ggml.eos_token_id", GGUF_UINT32, eos)
    w.add("tokenizer.ggml.add_bos_token", GGUF_BOOL, False)
    w.add("tokenizer.ggml.add_eos_token", GGUF_BOOL, False)

    lin = LINEAR_TYPE[args.type]

    def plain(name, gtype):
        return lambda: encode(ckpt.get(name), gtype)

    def roped(name, heads, gtype):
        return lambda: encode(permute_rope_rows(ckpt.get(name), heads), gtype)

    w.add_tensor("token_embd.weight", [vocab, hidden], GGML_F16,
                 plain("model.embed_tokens.weight", GGML_F16))
    factors = llama3_rope_factors(cfg, head_dim)
    if factors is not None:
        w.add_tensor("rope_freqs.weight", [head_dim // 2], GGML_F32, lambda: factors.tobytes())
    w.add_tensor("output_norm.weight", [hidden], GGML_F32, plain("model.norm.weight", GGML_F32))
    head = LINEAR_TYPE[args.output_type]
    if not tied or head != GGML_F16:
        source = "model.embed_tokens.weight" if tied else "lm_head.weight"
        w.add_tensor("output.weight", [vocab, hidden], head, plain(source, head))
    for i in range(n_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", [hidden], GGML_F32,
                     plain(p + "input_layernorm.weight", GGML_F32))
        w.add_tensor(b + "attn_q.weight", [n_heads * head_dim, hidden], lin,
                     roped(p + "self_attn.q_proj.weight", n_heads, lin))
        w.add_tensor(b + "attn_k.weight", [n_kv * head_dim, hidden], lin,
                     roped(p + "self_attn.k_proj.weight", n_kv, lin))
        w.add_tensor(b + "attn_v.weight", [n_kv * head_dim, hidden], lin,
                     plain(p + "self_attn.v_proj.weight", lin))
        w.add_tensor(b + "attn_output.weight", [hidden, n_heads * head_dim], lin,
                     plain(p + "self_attn.o_proj.weight", lin))
        w.add_tensor(b + "ffn_norm.weight", [hidden], GGML_F32,
                     plain(p + "post_attention_layernorm.weight", GGML_F32))
        w.add_tensor(b + "ffn_gate.weight", [ffn, hidden], lin,
                     plain(p + "mlp.gate_proj.weight", lin))
        w.add_tensor(b + "ffn_up.weight", [ffn, hidden], lin,
                     plain(p + "mlp.up_proj.weight", lin))
        w.add_tensor(b + "ffn_down.weight", [hidden, ffn], lin,
                     plain(p + "mlp.down_proj.weight", lin))

    t0 = time.time()
    last = [0.0]

    def log(done, total, name):
        now = time.time()
        if now - last[0] > 5 or done == total:
            last[0] = now
            print(f"  [{done}/{total}] {name}  {now - t0:.1f}s", flush=True)

    print(f"writing {args.out}: {n_layers} layers, hidden {hidden}, heads {n_heads}/{n_kv}, "
          f"head_dim {head_dim}, ffn {ffn}, vocab {vocab}, tied {tied}, linear {args.type}, "
          f"rope_theta {theta}, llama3 rope factors {'yes' if factors is not None else 'no'}",
          flush=True)
    w.write(args.out, log)
    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    sys.exit(main())
