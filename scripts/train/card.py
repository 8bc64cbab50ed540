"""Renders a model directory's README.md (model card) and loss.png from train_summary.json and
loss.csv written by scripts/train_model.py."""

import json
import os

from train.png import line_plot
from train.tokenizer import HF_SPLIT_PATTERN, SPECIALS


def read_loss_csv(path):
    rows = []
    with open(path) as f:
        next(f)
        for line in f:
            step, tokens, elapsed, lr, loss = line.strip().split(",")
            rows.append((int(step), int(tokens), float(elapsed), float(lr), float(loss)))
    return rows


def ema(values, beta=0.95):
    out, m = [], None
    for v in values:
        m = v if m is None else beta * m + (1 - beta) * v
        out.append(m)
    return out


def plot_loss(rows, path):
    xs = [r[1] for r in rows]
    ys = [r[4] for r in rows]
    sm = ema(ys)
    lo = min(ys) - 0.1
    hi = max(ys[min(len(ys) - 1, 5):] or ys) + 0.2
    line_plot(path, [(xs, ys, (175, 175, 215), 1), (xs, sm, (20, 40, 160), 2)],
              "TRAIN LOSS (NATS/TOKEN): RAW AND EMA 0.95", "TOKENS SEEN", "LOSS",
              ylim=(max(0.0, lo), hi))


def _mb(n):
    return "%.2f MB" % (n / 1e6)


def render_card(out_dir):
    with open(os.path.join(out_dir, "train_summary.json")) as f:
        s = json.load(f)
    rows = read_loss_csv(os.path.join(out_dir, "loss.csv"))
    plot_loss(rows, os.path.join(out_dir, "loss.png"))
    a, sh, d, ho, sm = s["args"], s["shape"], s["data"], s["held_out"], s["samples"]
    name = os.path.basename(os.path.normpath(out_dir))
    kv_bytes = 2 * sh["num_hidden_layers"] * sh["num_key_value_heads"] * sh["head_dim"] * 2
    checkpoints = [r for r in rows if r[0] in (1, 10, 50, 100, 200, 400, 800, 1200, 1600)]
    checkpoints.append(rows[-1])
    loss_table = "\n".join("| %d | %s | %.0f | %.2e | %.3f |" % (r[0], f"{r[1]:,}", r[2], r[3], r[4])
                           for r in sorted(set(checkpoints)))
    ext = s.get("external_checks", {})
    ext_lines = "\n".join("- %s" % v for v in ext.values()) or "- (none recorded)"
    if "cpp_generate" in s:
        ext_lines += ("\n\nThe C++ engine's greedy continuation (`model-inspect generate`, 64 tokens "
                      "at most, decoded with this tokenizer):\n\n```python\n%s\n```" %
                      s["cpp_generate"]["text"])
    v = s.get("verify", {})
    files = []
    for fn in sorted(os.listdir(out_dir)):
        files.append("| `%s` | %s |" % (fn, f"{os.path.getsize(os.path.join(out_dir, fn)):,}"))
    if "README.md" not in os.listdir(out_dir):
        files.append("| `README.md` | this file |")
    reproduce = ("/usr/bin/python3 scripts/train_model.py --out models/%s --seed %d "
                 "--threads %d --time-budget %g" % (name, a["seed"], a["threads"],
                                                     a["time_budget"]))
    if a["steps"]:
        reproduce = ("/usr/bin/python3 scripts/train_model.py --out models/%s --seed %d "
                     "--threads %d --steps %d" % (name, a["seed"], a["threads"], a["steps"]))
    if a.get("quick"):
        reproduce += " --quick"
    defaults_note = ""
    text = f"""# {name}

A small Llama-architecture (`LlamaForCausalLM`) code model trained from scratch by
`scripts/train_model.py` on the Python standard library sources that every Debian machine has.
It is Tandem's bundled model: the demo, the end-to-end tests, and the layer-pruning (POP) and
KV-cache experiments run on it. It writes Python-looking code; it is far too small to write
correct programs, and it is not meant for any real use.

| | |
|---|---|
| architecture | `LlamaForCausalLM` (RMSNorm, SwiGLU, RoPE θ={sh["rope_theta"]:g}, GQA, tied embeddings) |
| layers / hidden / FFN | {sh["num_hidden_layers"]} / {sh["hidden_size"]} / {sh["intermediate_size"]} |
| attention | {sh["num_attention_heads"]} query heads, {sh["num_key_value_heads"]} KV heads (GQA group {sh["num_attention_heads"] // sh["num_key_value_heads"]}), head_dim {sh["head_dim"]} |
| vocabulary | {sh["vocab_size"]} (byte-level BPE trained here) |
| context | `max_position_embeddings` {sh["max_position_embeddings"]}; trained on {a["seq_len"]}-token sequences |
| parameters | {s["parameters"]:,} (embedding {sh["vocab_size"] * sh["hidden_size"]:,}, tied with the LM head) |
| weights | `model.safetensors`, bf16, {s["safetensors_bytes"]:,} bytes |
| KV cache | {kv_bytes:,} bytes per token in bf16 (2 × {sh["num_hidden_layers"]} layers × {sh["num_key_value_heads"]} KV heads × {sh["head_dim"]} × 2 bytes) |
| held-out bits per byte | **{ho["bits_per_byte"]:.4f}** ({ho["nats_per_token"]:.4f} nats/token) on {ho["files"]} files never trained on |
| final train loss | {s["final_loss"]:.4f} nats/token (EMA 0.95: {s["final_loss_ema"]:.4f}) |
| training | {s["steps"]:,} steps, {s["tokens_seen"]:,} tokens seen ({s["epoch_fraction"]:.2f} epochs), {s["train_wall_s"] / 60:.1f} min of training, {s["total_wall_s"] / 60:.1f} min end to end |

## Data

- Source: every `*.py` file under `{d["root"]}` (Debian bookworm's Python 3.11 standard library),
  sorted by relative path, read as UTF-8 (files that do not decode are skipped: {len(d["skipped_undecodable"])} skipped).
- Excluded as test code: any directory component named `test`, `tests`, `idle_test`, `testing`,
  `testdata` (and `__pycache__`), and file names `test_*.py` / `*_test.py`.
- Held-out split: a file is held out when `int(sha256(relative_path)[:8], 16) % 1000 < 30`
  (~3%, independent of the seed). Held-out files are never trained on and are not seen by the
  tokenizer trainer. {d["held_out_files"]} files ({d["held_out_bytes"]:,} bytes) are held out; the list
  is `data.held_out_paths` in `train_summary.json`.
- Training set: {d["train_files"]} files, {d["train_bytes"]:,} bytes, {s["train_tokens"]:,} tokens
  ({s["bytes_per_token"]:.2f} bytes per token). Each file is encoded as `<|bos|> text <|eos|>` and
  the files are concatenated into one stream, cut into non-overlapping windows of
  {a["seq_len"]} + 1 tokens, and visited in a seeded random order.

## Tokenizer

Byte-level BPE trained by the script on the training files only (vocabulary {sh["vocab_size"]}):
id 0 `{SPECIALS[0]}` (BOS, prepended by the post-processor), id 1 `{SPECIALS[1]}` (EOS, ends every
training file), ids 2-257 the 256 bytes (GPT-2 byte-to-unicode mapping), ids 258-{sh["vocab_size"] - 1}
the merges in the order learned (most frequent pair first, ties to the lexicographically smallest
pair). Pre-tokenizer: `Split` with the GPT-2 regex, `Isolated`, then `ByteLevel` without its own
regex:

```
{HF_SPLIT_PATTERN}
```

`tokenizer.json` is a standard Hugging Face file (`BPE` model, `TemplateProcessing` adding
`{SPECIALS[0]}`, `ByteLevel` decoder); `tokenizer_config.json` sets `add_bos_token: true`.

Chat template (`chat_template` in `tokenizer_config.json`, for `/v1/chat/completions`): the model
was trained on Python files only and has no chat format, so the template turns a conversation
into what it knows: `{SPECIALS[0]}`, then a system message as a module docstring, each user
message as `# ` comment lines, and each assistant message as the code that follows (with
`{SPECIALS[1]}` after it when another turn follows). The assistant's turn is the code after the
last comment, so the generation prompt adds nothing. It will not chat well; it makes the chat
path run end to end on a real model.

## Training

- Plain-torch Llama with Hugging Face semantics (`scripts/train/model.py`), float32 training,
  weights rounded to bf16 (round to nearest even) when saved.
- Initialisation: normal(0, 0.02); `o_proj` and `down_proj` scaled by 1/sqrt(2 × layers); norms 1.
- AdamW (β = 0.9, 0.95, ε = 1e-8, weight decay {a["weight_decay"]} on matrices, 0 on norms),
  peak learning rate {a["lr"]:g}, {a["warmup"]} linear warmup steps, then cosine to
  {a["min_lr_ratio"]:g} × peak {"over the steps" if a["steps"] else "over the training wall-time budget (" + format(a["time_budget"], "g") + " s), so the schedule anneals fully however busy the machine is"};
  gradient clipping {a["clip"]:g}; batch {a["batch"]} × {a["seq_len"]} = {a["batch"] * a["seq_len"]:,} tokens per step.
- Seed {a["seed"]} (initialisation, data order, sampling); {a["threads"]} threads
  (`torch.set_num_threads`, OpenBLAS, passive OpenMP waiting).
- Machine: {s["machine"]}, shared with other jobs; torch {s["torch"]} (Debian `python3-torch`)
  with OpenBLAS (pthread). {s["tokens_per_s"]:.0f} tokens/s on average; stopped by {s["stopped_by"]}.
- Started {s["started_utc"]} UTC, finished {s["finished_utc"]} UTC.

![training loss](loss.png)

| step | tokens | seconds | lr | loss |
|---:|---:|---:|---:|---:|
{loss_table}

The full curve is `loss.csv` (step, tokens, elapsed seconds, learning rate, loss).

## Evaluation

Held-out bits per byte = (sum over held-out tokens of the cross-entropy, in bits) / (UTF-8 bytes
of the held-out files). Each held-out file is encoded as `<|bos|> text` and cut into
non-overlapping {a["seq_len"]}-token windows; every token of the file is predicted exactly once
from the preceding tokens of its window (the first window starts from `<|bos|>`). Computed with the
bf16 weights as saved: {ho["tokens"]:,} tokens, {ho["bytes"]:,} bytes, **{ho["bits_per_byte"]:.4f} bits/byte**.

## Sample

Prompt `{sm["prompt"]}` (ids with BOS: `{",".join(map(str, sm["prompt_ids"]))}`), 96 new tokens
at most, from the saved bf16 weights in the training script's torch model.

Greedy:

```python
{sm["greedy_text"]}
```

Temperature 0.7, top-k 40, seed {a["seed"]}:

```python
{sm["t0.7_top_k40_text"]}
```

## Checks

- Reloaded `model.safetensors` into the torch model: max |logit difference| against the float32
  in-memory model {v.get("reload_vs_fp32_max_abs_diff", float("nan")):.4g} (logits up to
  {v.get("max_abs_logit", float("nan")):.3g}; the difference is the bf16 rounding of the weights).
- `tests/reference/hf_reference.py` (independent float64 HF-Llama reference reading this
  directory): max |logit difference| against the reloaded torch model
  {v.get("hf_reference_vs_reload_max_abs_diff", float("nan")):.3g}, argmax agreement
  {v.get("hf_reference_argmax_agree", float("nan")):.3f} over 64 positions.
{ext_lines}

## Files

| file | bytes |
|---|---:|
{chr(10).join(files)}

## Reproduce

```
{reproduce}
```

`--time-budget` runs use a wall-clock cosine schedule, so a rerun on a machine of different speed
takes a different number of steps (this run: {s["steps"]}); `--steps {s["steps"]}` gives a
deterministic step-based schedule of the same length. `--quick` is a one-minute smoke test.
{defaults_note}"""
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(text)
