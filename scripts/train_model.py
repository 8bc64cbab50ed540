#!/usr/bin/python3
"""Trains Tandem's bundled model: a small Llama (LlamaForCausalLM) on the Python standard library.

Everything is local and seeded: the data is the *.py sources under /usr/lib/python3.11 (tests
excluded, ~3% of files held out by a hash of their path), the tokenizer is a byte-level BPE
trained here, and the model is a plain-torch Llama with Hugging Face semantics
(scripts/train/model.py). The output directory is a Hugging Face model directory the C++ engine
loads directly: config.json, generation_config.json, model.safetensors (bf16), tokenizer.json,
tokenizer_config.json, plus loss.csv, loss.png, train_summary.json and README.md (model card).

Run with Debian's interpreter (the one with python3-torch; libopenblas0-pthread makes it fast):

    /usr/bin/python3 scripts/train_model.py --out models/tandem-py-8l --seed 1234 \\
        --time-budget 2820 --threads 2          # the bundled model (~50 minutes on 2 cores)
    /usr/bin/python3 scripts/train_model.py --quick --out /tmp/tandem-quick   # ~1 minute smoke test
    /usr/bin/python3 scripts/train_model.py --write-card --out models/tandem-py-8l
        # re-renders README.md and loss.png from train_summary.json and loss.csv

Schedules: with --steps N the cosine learning-rate schedule is step-based and the run is
deterministic for a given seed and thread count. With only --time-budget S, the cosine schedule
follows the elapsed training wall time (so it always anneals fully inside the budget, however
busy the machine is); the data order, initialisation and sampling are still seeded, but the step
count depends on the machine's speed (it is recorded in train_summary.json and the model card).
"""

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

QUICKSORT_PROMPT = "def quicksort(arr):"


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Train the bundled small Llama model on the Python standard library.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", default=os.path.join(REPO, "models", "tandem-py-8l"),
                   help="output model directory (default: models/tandem-py-8l)")
    p.add_argument("--data-root", default="/usr/lib/python3.11", help="source tree to train on")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2, help="torch / OpenBLAS threads")
    p.add_argument("--steps", type=int, default=0,
                   help="optimizer steps (step-based cosine, deterministic); 0 = use the budget")
    p.add_argument("--time-budget", type=float, default=2820.0,
                   help="seconds of training (the optimisation loop only) when --steps is 0, "
                        "and a hard stop otherwise")
    p.add_argument("--quick", action="store_true",
                   help="~1 minute smoke test: data subset, 45 s of training, small eval")
    p.add_argument("--write-card", action="store_true",
                   help="only re-render README.md and loss.png of an existing --out directory")
    # Model shape.
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=384)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--max-positions", type=int, default=2048)
    # Optimisation.
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=4, help="sequences per optimizer step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=20, help="linear warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--eval-files", type=int, default=0, help="limit held-out files (0 = all)")
    args = p.parse_args(argv)
    if args.quick:
        if args.steps == 0:
            args.time_budget = min(args.time_budget, 45.0)
        args.eval_files = args.eval_files or 6
    return args


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def lr_at(args, step, progress):
    """Linear warmup over args.warmup steps, then cosine from lr to lr * min_lr_ratio."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(max(progress, 0.0), 1.0)
    lo = args.lr * args.min_lr_ratio
    return lo + 0.5 * (args.lr - lo) * (1 + math.cos(math.pi * p))


def model_config_json(shape, bos_id, eos_id):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "hidden_act": "silu",
        "hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads, "head_dim": shape.head_dim,
        "initializer_range": 0.02, "max_position_embeddings": shape.max_position_embeddings,
        "pretraining_tp": 1, "rms_norm_eps": shape.rms_norm_eps, "rope_scaling": None,
        "rope_theta": shape.rope_theta, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.46.0", "use_cache": True,
        "vocab_size": shape.vocab_size,
    }


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def encode_docs(tok, docs, eos_id):
    """[BOS] text [EOS] per document, concatenated."""
    stream = []
    for _, text in docs:
        stream.extend(tok.encode(text, add_bos=True))
        stream.append(eos_id)
    return stream


def evaluate_bpb(model, tok, docs, seq_len, torch):
    """Held-out bits per byte: every token of each file is predicted once, from [BOS] + the
    preceding tokens of its 512-token window (non-overlapping windows per file).
    bits/byte = sum of cross-entropy (bits) over those tokens / UTF-8 bytes of the files."""
    import torch.nn.functional as F
    total_nats, total_bytes, total_tokens = 0.0, 0, 0
    model.eval()
    with torch.no_grad():
        for _, text in docs:
            ids = tok.encode(text, add_bos=True)
            total_bytes += len(text.encode("utf-8"))
            for s in range(0, len(ids) - 1, seq_len):
                window = ids[s:s + seq_len + 1]
                x = torch.tensor([window[:-1]])
                y = torch.tensor(window[1:])
                logits = model(x)[0]
                total_nats += float(F.cross_entropy(logits, y, reduction="sum"))
                total_tokens += len(window) - 1
    model.train()
    return total_nats / math.log(2) / total_bytes, total_tokens, total_bytes, total_nats


def verify_saved(model, out_dir, torch, log_fn):
    """Reloads model.safetensors two ways and compares logits with the in-memory model."""
    from train import safetensors_io
    from train.model import LlamaForCausalLM
    ids = [0] + list(range(300, 363))
    x = torch.tensor([ids])
    with torch.no_grad():
        ref32 = model(x)[0].double()
        loaded = LlamaForCausalLM(model.shape)
        sd = safetensors_io.load(os.path.join(out_dir, "model.safetensors"))
        missing, unexpected = loaded.load_state_dict(sd, strict=False)
        assert not unexpected and all(k == "inv_freq" for k in missing), (missing, unexpected)
        bf = loaded(x)[0].double()
    res = {"max_abs_logit": float(ref32.abs().max()),
           "reload_vs_fp32_max_abs_diff": float((bf - ref32).abs().max())}
    ref_path = os.path.join(REPO, "tests", "reference")
    try:
        sys.path.insert(0, ref_path)
        import hf_reference
        ref = hf_reference.Reference.from_dir(out_dir)
        hf = torch.from_numpy(ref.logits(ids))
        res["hf_reference_vs_reload_max_abs_diff"] = float((hf - bf).abs().max())
        res["hf_reference_argmax_agree"] = float((hf.argmax(-1) == bf.argmax(-1)).double().mean())
    except Exception as e:  # the reference is a test helper; report rather than fail
        res["hf_reference_error"] = repr(e)
    log_fn("verify: %s" % json.dumps(res))
    return res


def train(args):
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    # Passive OpenMP waiting: spinning worker threads collapse throughput 3x when the cores are
    # shared with other jobs (measured on the 2-core build machine).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import torch
    from train import data, safetensors_io
    from train.model import LlamaForCausalLM, LlamaShape
    from train.tokenizer import BOS_ID, EOS_ID, train_bpe

    t_start = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    recorded = dict(vars(args))
    for key in ("out", "data_root"):  # repository-relative where possible
        rel = os.path.relpath(os.path.abspath(recorded[key]), REPO)
        recorded[key] = rel if not rel.startswith("..") else recorded[key]
    summary = {"args": recorded, "started_utc": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                time.gmtime()),
               "torch": torch.__version__, "machine": machine_description()}

    train_docs, held_docs, skipped = data.load_corpus(args.data_root)
    summary["data"] = {
        "root": args.data_root, "train_files": len(train_docs), "held_out_files": len(held_docs),
        "skipped_undecodable": skipped,
        "train_bytes": sum(len(t.encode("utf-8")) for _, t in train_docs),
        "held_out_bytes": sum(len(t.encode("utf-8")) for _, t in held_docs),
        "held_out_paths": [r for r, _ in held_docs]}
    log("data: %d train files (%d bytes), %d held out (%d bytes), %d undecodable skipped" % (
        len(train_docs), summary["data"]["train_bytes"], len(held_docs),
        summary["data"]["held_out_bytes"], len(skipped)))
    if args.quick:
        train_docs = train_docs[::8]

    t0 = time.time()
    tok = train_bpe((t for _, t in train_docs), args.vocab, log=log)
    assert len(tok) == args.vocab, len(tok)
    tok.save(args.out, args.max_positions)
    summary["tokenizer_train_s"] = time.time() - t0
    log("tokenizer: %d tokens in %.1fs" % (len(tok), summary["tokenizer_train_s"]))

    t0 = time.time()
    stream = encode_docs(tok, train_docs, EOS_ID)
    summary["train_tokens"] = len(stream)
    summary["train_files_used"] = len(train_docs)
    # Bytes per token of the text (the stream also holds one BOS and one EOS per file).
    summary["bytes_per_token"] = sum(len(t.encode("utf-8")) for _, t in train_docs) / (
        len(stream) - 2 * len(train_docs))
    log("encoded %d training tokens in %.1fs" % (len(stream), time.time() - t0))

    shape = LlamaShape(vocab_size=args.vocab, hidden_size=args.hidden,
                       intermediate_size=args.ffn, num_hidden_layers=args.layers,
                       num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                       head_dim=args.head_dim, max_position_embeddings=args.max_positions)
    model = LlamaForCausalLM(shape)
    gen = torch.Generator().manual_seed(args.seed)
    model.init_weights(gen)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == shape.num_parameters(), (n_params, shape.num_parameters())
    summary["shape"] = shape.as_dict()
    summary["parameters"] = n_params
    log("model: %s, %d parameters" % (shape.as_dict(), n_params))

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)

    # Non-overlapping windows of seq_len + 1 tokens (stride seq_len), in a seeded random order;
    # an epoch is one pass over all windows.
    data_t = torch.tensor(stream, dtype=torch.long)
    n_windows = (len(stream) - 1) // args.seq_len
    order_gen = torch.Generator().manual_seed(args.seed + 1)
    order, cursor, epoch = torch.randperm(n_windows, generator=order_gen), 0, 0

    def next_batch():
        nonlocal order, cursor, epoch
        rows = []
        for _ in range(args.batch):
            if cursor == n_windows:
                order, cursor, epoch = torch.randperm(n_windows, generator=order_gen), 0, epoch + 1
            s = int(order[cursor]) * args.seq_len
            cursor += 1
            rows.append(data_t[s:s + args.seq_len + 1])
        b = torch.stack(rows)
        return b[:, :-1], b[:, 1:]

    csv_path = os.path.join(args.out, "loss.csv")
    csv = open(csv_path, "w")
    csv.write("step,tokens,elapsed_s,lr,loss\n")
    step, tokens, t_train = 0, 0, time.time()
    ema = None
    stopped_by = "steps"
    while True:
        elapsed = time.time() - t_train
        if args.steps and step >= args.steps:
            break
        if elapsed >= args.time_budget:
            stopped_by = "time budget"
            break
        progress = (step - args.warmup) / max(1, args.steps - args.warmup) if args.steps \
            else elapsed / args.time_budget
        lr = lr_at(args, step, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = next_batch()
        loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        step += 1
        tokens += x.numel()
        lv = float(loss)
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        csv.write("%d,%d,%.1f,%.6g,%.5f\n" % (step, tokens, time.time() - t_train, lr, lv))
        csv.flush()
        if step % 10 == 0 or step == 1:
            log("step %d tokens %d loss %.4f (ema %.4f) lr %.2e %.0f tok/s" % (
                step, tokens, lv, ema, lr, tokens / (time.time() - t_train)))
    csv.close()
    train_s = time.time() - t_train
    summary.update({"steps": step, "tokens_seen": tokens, "train_wall_s": train_s,
                    "stopped_by": stopped_by, "epochs_completed": epoch,
                    "epoch_fraction": (epoch * n_windows + cursor) / n_windows,
                    "final_loss": lv, "final_loss_ema": ema,
                    "tokens_per_s": tokens / train_s})
    log("trained %d steps, %d tokens in %.0fs (stopped by %s), final loss %.4f ema %.4f" % (
        step, tokens, train_s, stopped_by, lv, ema))

    # Save first, so a failure below never loses the weights.
    model.eval()
    write_json(os.path.join(args.out, "config.json"), model_config_json(shape, BOS_ID, EOS_ID))
    write_json(os.path.join(args.out, "generation_config.json"),
               {"_from_model_config": True, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
                "transformers_version": "4.46.0"})
    state = {k: v for k, v in model.state_dict().items() if k != "inv_freq"}
    size = safetensors_io.save_bf16(os.path.join(args.out, "model.safetensors"), state)
    summary["safetensors_bytes"] = size
    log("saved %s (%d bytes)" % (args.out, size))
    # Continue with the bf16 weights the checkpoint holds: eval and samples describe the file.
    summary["verify"] = verify_saved(model, args.out, torch, log)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())

    t0 = time.time()
    docs = held_docs[:args.eval_files] if args.eval_files else held_docs
    bpb, n_tok, n_bytes, nats = evaluate_bpb(model, tok, docs, args.seq_len, torch)
    summary["held_out"] = {"files": len(docs), "tokens": n_tok, "bytes": n_bytes,
                           "bits_per_byte": bpb, "nats_per_token": nats / n_tok,
                           "eval_s": time.time() - t0}
    log("held-out: %d files, %d tokens, %d bytes: %.4f bits/byte, %.4f nats/token" % (
        len(docs), n_tok, n_bytes, bpb, nats / n_tok))

    prompt = tok.encode(QUICKSORT_PROMPT, add_bos=True)
    samples = {"prompt": QUICKSORT_PROMPT, "prompt_ids": prompt}
    greedy = model.generate(prompt, 96, temperature=0.0, eos_id=EOS_ID)
    samples["greedy_ids"] = greedy
    samples["greedy_text"] = QUICKSORT_PROMPT + tok.decode(greedy)
    sg = torch.Generator().manual_seed(args.seed)
    sampled = model.generate(prompt, 96, temperature=0.7, top_k=40, eos_id=EOS_ID, generator=sg)
    samples["t0.7_top_k40_ids"] = sampled
    samples["t0.7_top_k40_text"] = QUICKSORT_PROMPT + tok.decode(sampled)
    summary["samples"] = samples
    log("greedy sample:\n" + samples["greedy_text"])
    log("temperature 0.7 sample:\n" + samples["t0.7_top_k40_text"])

    summary["total_wall_s"] = time.time() - t_start
    summary["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    write_json(os.path.join(args.out, "train_summary.json"), summary)
    try:
        write_card(args.out)
    except Exception as e:  # re-render later with --write-card
        log("model card not written: %r" % (e,))
    log("done in %.0fs" % summary["total_wall_s"])


def machine_description():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s, %d logical cores visible" % (cpu, os.cpu_count() or 0)


def write_card(out_dir):
    from train.card import render_card
    render_card(out_dir)
    log("wrote %s/README.md and loss.png" % out_dir)


def main():
    args = parse_args()
    if args.write_card:
        write_card(args.out)
        return 0
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
