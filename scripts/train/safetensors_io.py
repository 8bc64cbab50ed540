"""Minimal safetensors writer/reader (bf16), the file format written byte for byte:
8-byte little-endian header length, JSON header (padded with spaces to 8 bytes), raw data."""

import json
import struct

import numpy as np
import torch


def save_bf16(path, tensors, metadata=None):
    """tensors: ordered {name: float tensor}; stored as BF16 (round to nearest even)."""
    header = {"__metadata__": dict(metadata or {}, format="pt")}
    blobs, offset = [], 0
    for name, t in tensors.items():
        raw = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return 8 + len(h) + offset


def load(path):
    """{name: float32 tensor} from a BF16/F32 safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F32":
            arr = np.frombuffer(raw, "<f4")
        else:
            raise ValueError(info["dtype"])
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out
