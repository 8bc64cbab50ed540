#!/usr/bin/python3
"""`model-inspect importance` (virtual-gate layer importance) against the torch reference.

The engine estimates E[(dL/dg)^2] per layer and stage by central finite differences of float32
losses; the reference differentiates the same loss exactly with autograd in float64 (gates as
tensors on each layer's attention and MLP outputs, one set for the prefill positions 0..P-2 and
one for the decode positions: the last prompt token and the teacher-forced continuation). Both
must agree within a few percent of the largest importance of the stage, and the last layer's
prefill importance must be zero in both (prompt tokens' last-layer outputs reach no loss). Exit
0 on pass, 1 on fail, 77 without torch.

  /usr/bin/python3 importance_test.py --model-dir models/tandem-py-8l \\
      --model-inspect build/tools/model_inspect/model-inspect --workdir /tmp/importance
"""

import argparse
import os
import re
import shutil
import sys

try:
    import torch
except ImportError as e:
    print("SKIP: torch unavailable for %s: %s" % (sys.executable, e))
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402
import parity_test  # noqa: E402

PROMPT, CONTINUATION, WINDOWS = 64, 16, 2
TOLERANCE = 0.05  # of the stage's largest importance: O(epsilon^2) differences, float32 losses
ROW = re.compile(r"^\s*(\d+)\s+([\d.e+-]+)\s+[\d.]+%\s+([\d.e+-]+)\s+[\d.]+%")


def reference_importance(ref, prompt, cont):
    """Squared loss gradients per layer: (prefill, decode)."""
    tokens = prompt + cont[:-1]
    n, split = len(tokens), len(prompt) - 1
    prefill = torch.ones(ref.layers, dtype=torch.float64, requires_grad=True)
    decode = torch.ones(ref.layers, dtype=torch.float64, requires_grad=True)
    is_prefill = torch.arange(n) < split
    gates = [torch.where(is_prefill, prefill[i], decode[i]) for i in range(ref.layers)]
    logits = ref._linear(ref.hidden_states(tokens, gates=gates), "lm_head")[split:]
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(cont))
    loss.backward()
    return (prefill.grad ** 2).tolist(), (decode.grad ** 2).tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--model-inspect", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    text_path = parity_test.one_line_text(args.workdir)
    out = parity_test.run([args.model_inspect, "importance", "--model", args.model_dir,
                           "--prompt-file", text_path, "--prompt-tokens", str(PROMPT),
                           "--continuation-tokens", str(CONTINUATION), "--windows",
                           str(WINDOWS), "--kv-dtype", "fp32",
                           # float inputs to every matrix, as the reference computes (oneDNN's
                           # bf16 matmul, auto where the CPU has bf16 dot products, rounds them)
                           "--cpu-gemm", "tandem"])[0]
    print(out.rstrip())
    got = {int(m.group(1)): (float(m.group(2)), float(m.group(3)))
           for m in map(ROW.match, out.splitlines()) if m}
    ids = parity_test.tokenize(args.model_inspect, args.model_dir, text_path)

    ref = hf_reference.Reference.from_dir(args.model_dir)
    bos = ref.config.get("bos_token_id")
    want = [[0.0] * ref.layers, [0.0] * ref.layers]
    stride = PROMPT - 1 + CONTINUATION
    for w in range(WINDOWS):
        body = ids[w * stride:(w + 1) * stride]
        for stage, values in enumerate(reference_importance(ref, [bos] + body[:PROMPT - 1],
                                                            body[PROMPT - 1:])):
            for layer, v in enumerate(values):
                want[stage][layer] += v / WINDOWS

    checks = [("one row per layer", sorted(got) == list(range(ref.layers)))]
    for stage, name in enumerate(("prefill", "decode")):
        scale = max(want[stage])
        worst = max(abs(got[l][stage] - want[stage][l]) for l in got) if got else float("inf")
        checks.append(("%s importance: max |engine - autograd| %.2e, %.1f%% of the largest "
                       "(%.3e)" % (name, worst, 100 * worst / scale, scale),
                       worst <= TOLERANCE * scale))
    last = ref.layers - 1
    checks.append(("last layer's prefill importance is zero (engine %.1e, autograd %.1e)" %
                   (got.get(last, (1, 1))[0], want[0][last]),
                   got.get(last, (1, 1))[0] == 0 and want[0][last] < 1e-20))
    checks.append(("a recommendation line", "recommendation:" in out))
    all_ok = True
    for what, ok in checks:
        print("%-4s %s" % ("ok" if ok else "FAIL", what))
        all_ok &= bool(ok)
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
