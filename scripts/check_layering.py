#!/usr/bin/env python3
"""Fails when a folder includes one it may not (DESIGN.md "Layout", docs/architecture.md
"Dependencies"). Reads every #include "..." line of the sources; prints each violation as
FILE:LINE: UNIT may not include HEADER, and exits 1 if there is any.

Usage: scripts/check_layering.py [ROOT]          (ROOT: the repository, default: this script's)
       scripts/check_layering.py --self-test     (checks that a bad include is caught)
"""
import os
import re
import sys
import tempfile

ROLES = {"router", "prefill_worker", "decode_worker", "cache_store"}
COMMON = {"util", "kernels", "kv", "model", "engine", "tokenizer", "chat", "config", "metrics",
          "rpc", "store", "security", "planner", "fabric"}
# What each unit may include besides itself and the generated protos (tandem/v1/...).
ALLOWED = {
    "common/util": set(),
    "common/kv": {"common/util"},
    "common/kernels": {"common/util", "common/kv:format"},
    "common/model": {"common/util", "common/kernels", "common/kv:format"},
    "common/engine": {"common/util", "common/kv", "common/model"},
    "common/tokenizer": {"common/util"},
    "common/chat": {"common/util"},
    "common/config": {"common/util"},
    "common/metrics": {"common/util"},
    "common/planner": {"common/util"},
    "common/security": {"common/util", "common/metrics"},
    "common/fabric": {"common/util"},
    "common/store": {"common/util", "common/rpc", "common/security", "common/fabric"},
    "common/rpc": {"common/util", "common/engine", "common/kv", "common/model", "common/metrics",
                   "common/security"},
}
for role in ROLES:
    ALLOWED[role] = {"common/" + c for c in COMMON}
ALLOWED["bench"] = ALLOWED["router"] | ROLES | {"bench"}
ALLOWED["tools"] = ALLOWED["bench"] | {"tools"}
# The KV format: the part of common/kv the kernels (and the model) may see.
KV_FORMAT = {"common/kv/kv_layout.h", "common/kv/kv_rows.h", "common/kv/block_memory.h"}
SOURCE_DIRS = ["common", "router", "prefill_worker", "decode_worker", "cache_store", "tools",
               "bench"]


def unit_of(path):
    parts = path.split("/")
    if parts[0] == "common" and len(parts) > 2:
        return "common/" + parts[1]
    return parts[0]


PROJECT_DIRS = set(SOURCE_DIRS) | {"tests"}


def allows(unit, header):
    if header.split("/")[0] not in PROJECT_DIRS:
        return True  # generated protos (tandem/v1/...) and other libraries' headers
    target = unit_of(header)
    if target == unit:
        return True
    allowed = ALLOWED.get(unit)
    if allowed is None:
        return True  # tests and anything not listed
    if target in allowed:
        return True
    return header in KV_FORMAT and "common/kv:format" in allowed


def violations(root):
    found = []
    for top in SOURCE_DIRS:
        for directory, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.join(directory, name)
                rel = os.path.relpath(path, root)
                unit = unit_of(rel)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                        if m and "/" in m.group(1) and not allows(unit, m.group(1)):
                            found.append(f"{rel}:{number}: {unit} may not include {m.group(1)}")
    return found


def self_test():
    bad = {
        "decode_worker/x.cc": '#include "prefill_worker/prefill_service.h"\n',
        "common/store/y.cc": '#include "cache_store/block_store.h"\n',
        "common/kernels/z.cc": '#include "common/kv/kv_cache_manager.h"\n',
        "common/util/w.h": '#include "common/kv/kv_layout.h"\n',
    }
    good = {
        "common/kernels/a.cc": '#include "common/kv/kv_layout.h"\n#include "tandem/v1/kv.pb.h"\n',
        "router/b.cc": '#include "common/rpc/status.h"\n#include "router/worker_pool.h"\n'
                       '#include "absl/strings/str_cat.h"\n',
        "tools/c.cc": '#include "router/router_service.h"\n#include "decode_worker/d.h"\n',
    }
    with tempfile.TemporaryDirectory() as root:
        for rel, text in {**bad, **good}.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        found = violations(root)
    caught = {v.split(":")[0] for v in found}
    if caught != set(bad):
        print("self-test failed: caught", sorted(caught), "expected", sorted(bad))
        return 1
    print(f"self-test passed: {len(bad)} bad includes caught, {len(good)} good ones allowed")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))
    found = violations(root)
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} include(s) break the layering (docs/architecture.md, Dependencies)")
        return 1
    print("layering: every include follows the allowed graph")
    return 0


if __name__ == "__main__":
    sys.exit(main())
