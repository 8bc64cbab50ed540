#!/usr/bin/python3
"""Parity of pruned prefill (POP) in the C++ engine with the independent torch reference.

For each case: generate a random model, run `model-inspect forward` with prune flags on a
40-token prompt drawn from a few ids (so that token frequencies differ and protection picks
real positions), and compare every position's logits with hf_reference.py run with the same
pruned layers and full-depth positions (the last token and the positions of the N most frequent
ids). Also checks that pruning changes the logits clearly, so a flag the engine ignored fails.
Exit 0 on pass, 1 on fail, 77 when torch is unavailable.

  /usr/bin/python3 pruning_parity_test.py --case all \\
      --model-inspect build/tools/model_inspect/model-inspect \\
      --make-model build/tools/make_random_model/make-random-model --workdir /tmp/pop
"""

import argparse
import json
import os
import shutil
import sys

try:
    import numpy as np
    import torch  # noqa: F401
except ImportError as e:
    print("SKIP: torch/numpy unavailable for %s: %s" % (sys.executable, e))
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402
import parity_test  # noqa: E402

PROMPT_LEN = 40
TOLERANCE = parity_test.TOLERANCE["fp32"]
# Pruning must move the logits by far more than the engine's arithmetic error.
MIN_EFFECT = 1e-2

# Case -> (make-random-model spec, forward flags, pruned layers as the docs define them).
CASES = {
    # 6 layers, start 2, keep every 2nd: layers 2 and 4 pruned, 3 and 5 kept; 3 protected ids.
    "llama_keep_every": (dict(arch="llama", heads=4, kv_heads=2, tie=False, layers=6),
                         ["--prune-start-layer", "2", "--prune-keep-every", "2",
                          "--protect-tokens", "3"], {2, 4}),
    # Per-head k_norm in the K/V of pruned tokens; the last half of 4 layers by ratio.
    "qwen3_ratio": (dict(arch="qwen3", heads=4, kv_heads=2, head_dim=32, tie=False, layers=4),
                    ["--prune-ratio", "0.5"], {2, 3}),
    # q/k/v biases; the last third of 6 layers; one protected id.
    "qwen2_third": (dict(arch="qwen2", heads=4, kv_heads=2, tie=True, layers=6),
                    ["--prune-ratio", "0.34", "--protect-tokens", "1"], {4, 5}),
}


def full_depth_positions(prompt, protect, special):
    """The last position and every position of the `protect` most frequent non-special ids
    (ties: the id seen first)."""
    counts, first = {}, {}
    for i, t in enumerate(prompt):
        if t in special:
            continue
        counts[t] = counts.get(t, 0) + 1
        first.setdefault(t, i)
    ranked = sorted(counts, key=lambda t: (-counts[t], first[t]))[:protect]
    full = [t in ranked for t in prompt]
    full[-1] = True
    return full


def engine_logits(args, model, prompt, flags, path, vocab):
    parity_test.run([args.model_inspect, "forward", "--model", model, "--tokens",
                     ",".join(map(str, prompt)), "--logits-out", path] + flags)
    data = np.fromfile(path, dtype="<f4")
    if data.size != len(prompt) * vocab:
        raise RuntimeError("logits file has %d floats, want %d x %d" %
                           (data.size, len(prompt), vocab))
    return data.reshape(len(prompt), vocab).astype(np.float64)


def run_case(case, args):
    spec, flags, pruned = CASES[case]
    work = os.path.join(args.workdir, case)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model = os.path.join(work, "model")
    parity_test.run([args.make_model] + parity_test.make_model_args(case, spec, model))
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    special = set()
    for key in ("bos_token_id", "eos_token_id"):
        value = config.get(key)
        special.update(value if isinstance(value, list) else [] if value is None else [value])
    protect = int(flags[flags.index("--protect-tokens") + 1]) if "--protect-tokens" in flags else 0

    rng = np.random.RandomState(sum(map(ord, case)))
    ref = hf_reference.Reference.from_dir(model)
    alphabet = rng.choice(ref.vocab, size=12, replace=False)
    prompt = [int(t) for t in rng.choice(alphabet, size=PROMPT_LEN, p=np.linspace(2, 0.2, 12) /
                                          np.linspace(2, 0.2, 12).sum())]
    full = full_depth_positions(prompt, protect, special)

    want = ref.logits(prompt, pruned_layers=pruned, full_depth=full)
    unpruned = ref.logits(prompt)
    got = engine_logits(args, model, prompt, flags, os.path.join(work, "logits.f32"), ref.vocab)
    std = want.std()
    rel = np.abs(got - want).max() / std
    rel_mean = np.abs(got - want).mean() / std
    effect = np.abs(want[-1] - unpruned[-1]).max() / std
    ok = bool(rel <= TOLERANCE[0] and rel_mean <= TOLERANCE[1] and effect >= MIN_EFFECT)
    summary = ("%-16s %-4s pruned layers %s, %d/%d positions full depth: logits max|diff|/std "
               "%.2e (tol %.2g), mean %.1e; pruning moves the last token's logits by %.2e "
               "(need >= %.0e)" % (case, "ok" if ok else "FAIL", sorted(pruned), sum(full),
                                  len(full), rel, TOLERANCE[0], rel_mean, effect, MIN_EFFECT))
    return ok, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", required=True, help="one of %s, or all" % ", ".join(CASES))
    parser.add_argument("--model-inspect", required=True)
    parser.add_argument("--make-model", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    cases = list(CASES) if args.case == "all" else [args.case]
    if any(c not in CASES for c in cases):
        parser.error("unknown case %s" % args.case)
    all_ok = True
    for case in cases:
        try:
            ok, summary = run_case(case, args)
        except Exception as e:  # A crash of the engine is a failure of the case.
            ok, summary = False, "%-16s FAIL %s" % (case, e)
        print(summary)
        all_ok &= ok
        if ok:
            shutil.rmtree(os.path.join(args.workdir, case), ignore_errors=True)
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
