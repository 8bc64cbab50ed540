#!/usr/bin/env python3
"""Greedy agreement and logit drift of a KV cache dtype, or a weight quantization, against the base.

Cuts a text into windows of --prompt tokens, generates --steps greedy tokens from each with
`model-inspect generate --kv-dtype A` and `--kv-dtype B`, and prints the fraction of positions
where the two continuations agree, and the fraction of windows that agree entirely. It also
runs `model-inspect forward` over the first --forward tokens with both dtypes and prints the
largest and mean logit difference relative to the logits' standard deviation, and how often
the argmax agrees (teacher-forced). A mixed cache (--kv-dtype mixed, with --sink-tokens and
--window-tokens) only differs from fp16 once tokens fall behind its window during generation, so
the one-pass forward comparison is skipped for it.

With --weight-quantization int8|int4 (and --group-size G) both sides keep the --base KV dtype
and the evaluated side quantizes the model's weights at load instead (model.weight_quantization),
lm_head too with --lm-head-quantization int8 (model.lm_head_quantization; alone, or with them).

  scripts/greedy_agreement.py --model models/tandem-py-8l --text-file F [--base fp32]
      [--kv-dtype int8|mixed] [--sink-tokens 4] [--window-tokens 64] [--prompt 256]
      [--steps 64] [--windows 16] [--forward 1024]
      [--weight-quantization int8|int4 [--group-size G] [--activation-quantization int8]]
      [--lm-head-quantization int8]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np


def run(cmd):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True).stdout


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--text-file", required=True)
    p.add_argument("--model-inspect", default="build/tools/model_inspect/model-inspect")
    p.add_argument("--base", default="fp32")
    p.add_argument("--kv-dtype", default="int8")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--forward", type=int, default=1024)
    p.add_argument("--sink-tokens", type=int, default=4)
    p.add_argument("--window-tokens", type=int, default=64)
    p.add_argument("--weight-quantization", default="none")
    p.add_argument("--group-size", type=int, default=0)
    p.add_argument("--activation-quantization", default="none")
    p.add_argument("--lm-head-quantization", default="none")
    a = p.parse_args()
    # (KV dtype, extra model-inspect flags) of the base and the evaluated side.
    if a.weight_quantization != "none" or a.lm_head_quantization != "none":
        sides = [(a.base, []), (a.base, ["--weight-quantization", a.weight_quantization,
                                         "--weight-quantization-group-size", str(a.group_size),
                                         "--activation-quantization",
                                         a.activation_quantization,
                                         "--lm-head-quantization", a.lm_head_quantization])]
    else:
        sides = [(a.base, []), (a.kv_dtype, [])]
    mi = a.model_inspect
    ids = [int(t) for t in run([mi, "tokenize", "--model", a.model, "--text-file",
                                a.text_file]).replace("\n", ",").split(",") if t]
    span = a.prompt + a.steps
    if len(ids) < span * a.windows:
        sys.exit("text too short: %d tokens for %d windows of %d" % (len(ids), a.windows, span))
    stride = (len(ids) - span) // max(1, a.windows - 1)
    same = total = whole = 0
    for w in range(a.windows):
        prompt = ",".join(map(str, ids[w * stride:w * stride + a.prompt]))
        outs = []
        for dt, extra in sides:
            cmd = [mi, "generate", "--model", a.model, "--tokens", prompt, "--max-tokens",
                   str(a.steps), "--ignore-eos", "--kv-dtype", dt] + extra
            if dt == "mixed":
                cmd += ["--kv-sink-tokens", str(a.sink_tokens), "--kv-window-tokens",
                        str(a.window_tokens)]
            out = run(cmd)
            outs.append(out.strip().splitlines()[-1].split(","))
        agree = sum(x == y for x, y in zip(*outs))
        same += agree
        total += a.steps
        whole += agree == a.steps
    print("greedy agreement over %d tokens, %d windows of %d-token prompts: %.4f "
          "(%d/%d windows identical)" % (a.steps, a.windows, a.prompt, same / total, whole,
                                         a.windows))
    if "mixed" in (sides[0][0], sides[1][0]):
        return
    n = min(a.forward, len(ids))
    tokens = ",".join(map(str, ids[:n]))
    with tempfile.TemporaryDirectory() as tmp:
        logits = []
        for i, (dt, extra) in enumerate(sides):
            path = os.path.join(tmp, "%d.f32" % i)
            run([mi, "forward", "--model", a.model, "--tokens", tokens, "--logits-out", path,
                 "--kv-dtype", dt] + extra)
            logits.append(np.fromfile(path, dtype="<f4").reshape(n, -1).astype(np.float64))
    base, other = logits
    diff = np.abs(base - other) / base.std()
    print("forward over %d tokens: max |logit diff|/std %.4f, mean %.5f, argmax agreement %.4f"
          % (n, diff.max(), diff.mean(), (base.argmax(1) == other.argmax(1)).mean()))


if __name__ == "__main__":
    main()
