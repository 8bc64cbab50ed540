#!/usr/bin/python3
"""`model-inspect prune-eval` against the independent torch reference, on a bundled model.

prune-eval prefills each window's prompt four ways (full, POP, POP without boundary handling,
POP without independent KV), runs the true continuation at full depth on the cache prefill left,
and reports bits per token of the continuation, KL(full || variant) of the first-token
distribution, first-token agreement, and greedy agreement. This test recomputes every one of
those numbers with hf_reference.py (float64, no KV cache: a pruned prefill followed by
full-depth tokens is one pruned forward whose later positions are all full depth) and compares.
Text: one line made of the standard library's heapq.py, so that `model-inspect tokenize` gives
the same ids prune-eval cuts its windows from. Exit 0 on pass, 1 on fail, 77 without torch.

  /usr/bin/python3 prune_eval_test.py --model-dir models/tandem-py-8l \\
      --model-inspect build/tools/model_inspect/model-inspect --workdir /tmp/prune_eval
"""

import argparse
import json
import math
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
from pruning_parity_test import full_depth_positions  # noqa: E402

PROMPT, CONTINUATION, GREEDY, WINDOWS, PROTECT = 96, 24, 8, 2, 3
FLAGS = ["--prompt-tokens", str(PROMPT), "--continuation-tokens", str(CONTINUATION),
         "--greedy-tokens", str(GREEDY), "--windows", str(WINDOWS), "--prune-ratio", "0.34",
         "--protect-tokens", str(PROTECT), "--kv-dtype", "fp32", "--json"]
# float32 engine against float64 reference.
BITS_TOL = 2e-3     # bits per token
KL_TOL = (1e-4, 1e-2)  # absolute + relative


def log_softmax(row):
    m = row.max()
    return row - (m + math.log(np.exp(row - m).sum()))


def reference_variant(ref, prompt, cont, pruned, full, variant):
    """(first-token log-probs, continuation bits, greedy ids) of one window."""
    kwargs = {}
    if variant != "full":
        prompt_full = list(full)
        if variant == "pop-no-boundary":
            prompt_full[-1] = False
        kwargs = dict(pruned_layers=pruned, independent_kv=variant != "pop-no-independent-kv")

    def run(tokens):
        if not kwargs:
            return ref.logits(tokens)
        depth = prompt_full + [True] * (len(tokens) - len(prompt))
        return ref.logits(tokens, full_depth=depth, **kwargs)

    logits = run(prompt + cont)
    first = log_softmax(logits[len(prompt) - 1])
    bits = 0.0
    for i, t in enumerate(cont):
        bits -= log_softmax(logits[len(prompt) - 1 + i])[t]
    greedy = [int(np.argmax(first))]
    while len(greedy) < GREEDY:
        greedy.append(int(np.argmax(run(prompt + greedy)[-1])))
    return first, bits / math.log(2), greedy


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--model-inspect", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)

    text_path = parity_test.one_line_text(args.workdir)
    ids = parity_test.tokenize(args.model_inspect, args.model_dir, text_path)
    got = json.loads(parity_test.run([args.model_inspect, "prune-eval", "--model", args.model_dir,
                                      "--text-file", text_path] + FLAGS)[0])

    ref = hf_reference.Reference.from_dir(args.model_dir)
    config = ref.config
    bos = config.get("bos_token_id")
    eos = config.get("eos_token_id")
    special = {bos} | set(eos if isinstance(eos, list) else [eos])
    start = ref.layers - round(0.34 * ref.layers)  # the docs: the last third, rounded
    pruned = set(range(start, ref.layers))
    checks = [("pruned layers %s" % sorted(got["pruned_layers"]),
               set(got["pruned_layers"]) == pruned and got["windows"] == WINDOWS)]

    variants = [v["variant"] for v in got["variants"]]
    sums = {v: dict(bits=0.0, kl=0.0, first=0, greedy=0) for v in variants}
    stride = PROMPT - 1 + CONTINUATION
    for w in range(WINDOWS):
        body = ids[w * stride:(w + 1) * stride]
        prompt, cont = [bos] + body[:PROMPT - 1], body[PROMPT - 1:]
        full = full_depth_positions(prompt, PROTECT, special)
        results = {v: reference_variant(ref, prompt, cont, pruned, full, v) for v in variants}
        base_first, _, base_greedy = results["full"]
        for v, (first, bits, greedy) in results.items():
            s = sums[v]
            s["bits"] += bits
            s["kl"] += float((np.exp(base_first) * (base_first - first)).sum())
            s["first"] += greedy[0] == base_greedy[0]
            s["greedy"] += sum(a == b for a, b in zip(greedy, base_greedy))

    for row in got["variants"]:
        s = sums[row["variant"]]
        want_bits = s["bits"] / (WINDOWS * CONTINUATION)
        want_kl = s["kl"] / WINDOWS
        want_first = s["first"] / WINDOWS
        want_greedy = s["greedy"] / (WINDOWS * GREEDY)
        ok = (abs(row["bits_per_token"] - want_bits) <= BITS_TOL and
              abs(row["first_token_kl_nats"] - want_kl) <= KL_TOL[0] + KL_TOL[1] * want_kl and
              abs(row["first_token_agreement"] - want_first) < 1e-9 and
              abs(row["greedy_agreement"] - want_greedy) < 1e-3)
        checks.append(("%-22s bits/token %.4f (ref %.4f), first-token KL %.3e (ref %.3e), "
                       "first same %.2f (ref %.2f), greedy same %.3f (ref %.3f)" %
                       (row["variant"], row["bits_per_token"], want_bits,
                        row["first_token_kl_nats"], want_kl, row["first_token_agreement"],
                        want_first, row["greedy_agreement"], want_greedy), ok))
    # The variants must differ from full where the reference says they do, or the engine
    # ignored a flag.
    moved = all(sums[v]["kl"] > 1e-6 for v in variants if v != "full")
    checks.append(("every pruned variant moves the first-token distribution", moved))
    all_ok = True
    for what, ok in checks:
        print("%-4s %s" % ("ok" if ok else "FAIL", what))
        all_ok &= bool(ok)
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
