// decode_bench.mjs: prefill and single-sequence decode speed of llama.cpp on the CPU, through the
// prebuilt binaries of the node-llama-cpp npm package, for a side-by-side with Tandem on the same
// weights (see write_gguf.py next to this file).
//
//   node bench/llama_cpp/decode_bench.mjs --model FILE.gguf [--threads 2] [--prompt 128]
//        [--steps 32] [--repeats 3] [--first-token 1000] [--module-dir DIR]
//        [--flash-attention on|off|auto (default off)] [--context-size N] [--verbose]
//
// node-llama-cpp is found by a plain import, else under --module-dir (a node_modules directory
// or the package directory itself), else under each entry of NODE_PATH (which ESM imports ignore
// on their own), e.g.
//   NODE_PATH=/tmp/llamacpp/node_modules node bench/llama_cpp/decode_bench.mjs --model m.gguf
// It always runs the CPU build (gpu: false) and never compiles llama.cpp (build: "never").
//
// Each repeat clears the sequence, prefills --prompt fixed token ids (--first-token,
// --first-token+1, ... modulo the vocabulary), then decodes --steps tokens greedily, one at a
// time, ignoring end-of-generation tokens. Prefill time: from submitting the prompt to the first
// sampled token. Decode time: each later token, timed from the previous one (the first step after
// prefill is not counted). Output: JSON lines, one per repeat ("kind":"repeat") and a summary
// ("kind":"summary") with medians over the repeats.
//
// Checks against Tandem (both print one JSON line):
//   --tokens 1,2,3 --greedy N        the N greedy ids after the prompt (compare with
//                                    `model-inspect generate --tokens 1,2,3 --max-tokens N`)
//   --tokens 1,2,3 --compare-logits FILE
//                                    FILE: `model-inspect forward --logits-out` output (float32
//                                    [n_tokens, vocab]); prints max |diff|, per-position argmax
//                                    agreement and the largest logit magnitude
// (use `model-inspect generate ... --ignore-eos`: the greedy ids here ignore EOS too).
//
// Tandem's side of the comparison, on the checkpoint the GGUF was written from:
//   build/bench/engine-bench --model DIR --prompt-lens 128 --batches 1 --decode-steps 32 \
//     --repeats 3 --threads 2 [--weight-quantization int8|int4 --weight-quantization-group-size 32]
// Notes: ggml threads spin while they wait, so with --threads equal to the core count on a busy
// host decode slows down by orders of magnitude; compare on an idle host. On CPUs with AVX2 or
// AVX-512 llama.cpp repacks Q4_0/Q8_0 matrices at load ("repack_buffer_mib" in the output).
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

function parseArgs(argv) {
  const opts = {
    model: null, threads: 2, prompt: 128, steps: 32, repeats: 3, firstToken: 1000,
    moduleDir: null, tokens: null, greedy: 0, compareLogits: null, contextSize: null,
    verbose: false, flashAttention: false,
  };
  const need = (i) => {
    if (i + 1 >= argv.length) throw new Error(`${argv[i]} needs a value`);
    return argv[i + 1];
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    switch (a) {
      case "--model": opts.model = need(i); i++; break;
      case "--threads": opts.threads = parseInt(need(i), 10); i++; break;
      case "--prompt": opts.prompt = parseInt(need(i), 10); i++; break;
      case "--steps": opts.steps = parseInt(need(i), 10); i++; break;
      case "--repeats": opts.repeats = parseInt(need(i), 10); i++; break;
      case "--first-token": opts.firstToken = parseInt(need(i), 10); i++; break;
      case "--module-dir": opts.moduleDir = need(i); i++; break;
      case "--context-size": opts.contextSize = parseInt(need(i), 10); i++; break;
      case "--tokens": opts.tokens = need(i).split(",").map((s) => parseInt(s, 10)); i++; break;
      case "--greedy": opts.greedy = parseInt(need(i), 10); i++; break;
      case "--compare-logits": opts.compareLogits = need(i); i++; break;
      case "--verbose": opts.verbose = true; break;
      case "--flash-attention": {
        const v = need(i); i++;
        if (!["on", "off", "auto"].includes(v)) throw new Error("--flash-attention on|off|auto");
        opts.flashAttention = v === "auto" ? "auto" : v === "on";
        break;
      }
      case "-h": case "--help":
        console.log(fs.readFileSync(new URL(import.meta.url), "utf8").split("\nimport ")[0]);
        process.exit(0);
      default: throw new Error(`unknown argument ${a}`);
    }
  }
  if (!opts.model) throw new Error("--model FILE.gguf is required");
  for (const k of ["threads", "prompt", "steps", "repeats"]) {
    if (!(opts[k] >= 1)) throw new Error(`--${k} must be a positive integer`);
  }
  if (opts.tokens && opts.tokens.some((t) => !Number.isInteger(t) || t < 0)) {
    throw new Error("--tokens: comma-separated non-negative ids");
  }
  return opts;
}

async function importNodeLlamaCpp(moduleDir) {
  const bases = [];
  if (moduleDir) bases.push(path.resolve(moduleDir));
  for (const p of (process.env.NODE_PATH || "").split(path.delimiter)) if (p) bases.push(p);
  for (const base of bases) {
    // base may be a node_modules directory or the package directory itself.
    for (const dir of [path.join(base, "node-llama-cpp"), base]) {
      const pkg = path.join(dir, "package.json");
      if (!fs.existsSync(pkg)) continue;
      const meta = JSON.parse(fs.readFileSync(pkg, "utf8"));
      if (meta.name !== "node-llama-cpp") continue;
      const entry = path.join(dir, meta.exports?.["."]?.import ?? meta.main ?? "dist/index.js");
      return { mod: await import(pathToFileURL(entry).href), version: meta.version, dir };
    }
  }
  try {
    const mod = await import("node-llama-cpp");
    let version = null;
    let dir = null;
    try {
      const req = createRequire(import.meta.url);
      const pkg = req.resolve("node-llama-cpp/package.json");
      version = JSON.parse(fs.readFileSync(pkg, "utf8")).version;
      dir = path.dirname(pkg);
    } catch { /* exports may hide package.json */ }
    return { mod, version, dir };
  } catch (e) {
    throw new Error("cannot find node-llama-cpp: pass --module-dir /path/to/node_modules or set " +
                    `NODE_PATH (${e.message})`);
  }
}

// Shared objects of ggml/llama.cpp mapped into this process (which libggml-cpu-* variant the
// backend loader picked for this CPU).
function loadedGgmlLibs() {
  try {
    const maps = fs.readFileSync("/proc/self/maps", "utf8");
    const libs = new Set();
    for (const line of maps.split("\n")) {
      const m = line.match(/(\/\S*\/(lib(?:ggml|llama)[^/\s]*\.so[^/\s]*))$/);
      if (m) libs.add(m[1]);
    }
    return [...libs].sort();
  } catch {
    return [];
  }
}

function median(v) {
  const s = [...v].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const { mod, version, dir } = await importNodeLlamaCpp(opts.moduleDir);
  const { getLlama, LlamaLogLevel } = mod;

  const llamaLog = [];
  const llama = await getLlama({
    gpu: false,
    build: "never",
    usePrebuiltBinaries: true,
    skipDownload: true,
    progressLogs: false,
    maxThreads: opts.threads,
    // info level is kept (not printed) to report the CPU_REPACK buffer; warnings go to stderr.
    logLevel: opts.verbose ? LlamaLogLevel.debug : LlamaLogLevel.info,
    logger: (level, message) => {
      llamaLog.push(message);
      // The placeholder vocabulary of write_gguf.py does not round-trip text; ids are all we use.
      if (!opts.verbose && /tokenize text and then detokenize/.test(message)) return;
      if (opts.verbose || level === "warn" || level === "error" || level === "fatal") {
        process.stderr.write(`[llama ${level}] ${message}${message.endsWith("\n") ? "" : "\n"}`);
      }
    },
  });

  const model = await llama.loadModel({ modelPath: opts.model, gpuLayers: 0, useMmap: true });
  const vocab = model.fileInsights?.vocabularySize ?? model.fileInfo?.metadata?.llama?.vocab_size;
  const checkMode = opts.greedy > 0 || opts.compareLogits;
  const promptLen = checkMode ? (opts.tokens ?? [1, 2, 3]).length : opts.prompt;
  const needCtx = promptLen + (checkMode ? opts.greedy : opts.steps) + 8;
  const contextSize = opts.contextSize ?? Math.max(256, Math.ceil(needCtx / 256) * 256);
  const context = await model.createContext({
    contextSize,
    batchSize: Math.max(promptLen, 1),
    sequences: 1,
    threads: { ideal: opts.threads, min: opts.threads },
    flashAttention: opts.flashAttention,
  });
  const sequence = context.getSequence();

  // Q4_0/Q8_0 matrices that llama.cpp re-lays out for its CPU kernels ("repack") live in a
  // separate CPU_REPACK buffer instead of the mmapped file.
  const repackLine = llamaLog.find((m) => /CPU_REPACK model buffer size/.test(m));
  const repackMiB = repackLine ? parseFloat(repackLine.split("=").pop()) : 0;
  const info = {
    llama_cpp_release: llama.llamaCppRelease?.release,
    llama_cpp_repo: llama.llamaCppRelease?.repo,
    node_llama_cpp: version,
    node_llama_cpp_dir: dir,
    build_type: llama.buildType,
    gpu: llama.gpu,
    ggml_libs: loadedGgmlLibs().map((p) => path.basename(p)),
    cpu_variant: (loadedGgmlLibs().map((p) => path.basename(p))
                    .find((b) => b.startsWith("libggml-cpu")) ?? "unknown"),
    system_info: llama.systemInfo,
    repack_buffer_mib: repackMiB,
    threads: opts.threads,
    context_threads: context.currentThreads,
    model: path.resolve(opts.model),
    model_bytes: fs.statSync(opts.model).size,
    vocab,
    context_size: context.contextSize,
    flash_attention: context.flashAttention,
    host_cpu: os.cpus()[0]?.model,
    host_cores: os.cpus().length,
    date: new Date().toISOString(),
  };

  if (checkMode) {
    const prompt = opts.tokens ?? [1, 2, 3];
    if (opts.compareLogits) {
      const input = prompt.map((t) => [t, { generateNext: { logits: true } }]);
      const out = await sequence.controlledEvaluate(input);
      const buf = fs.readFileSync(opts.compareLogits);
      const ref = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
      const V = ref.length / prompt.length;
      if (!Number.isInteger(V) || (vocab && V !== vocab)) {
        throw new Error(`${opts.compareLogits}: ${ref.length} floats is not ${prompt.length} x ${vocab}`);
      }
      let maxDiff = 0, maxRef = 0, agree = 0;
      const perPos = [];
      for (let p = 0; p < prompt.length; p++) {
        const logits = out[p]?.next?.logits;
        if (!logits) throw new Error(`no logits for position ${p}`);
        let best = -1, bestV = -Infinity, rBest = -1, rBestV = -Infinity, posDiff = 0;
        for (let t = 0; t < V; t++) {
          const r = ref[p * V + t];
          const l = logits.get(t);
          if (l === undefined) throw new Error(`no logit for token ${t}`);
          posDiff = Math.max(posDiff, Math.abs(l - r));
          maxRef = Math.max(maxRef, Math.abs(r));
          if (l > bestV) { bestV = l; best = t; }
          if (r > rBestV) { rBestV = r; rBest = t; }
        }
        maxDiff = Math.max(maxDiff, posDiff);
        if (best === rBest) agree++;
        perPos.push({ pos: p, llama_argmax: best, tandem_argmax: rBest, max_abs_diff: posDiff });
      }
      console.log(JSON.stringify({
        kind: "compare_logits", tokens: prompt, positions: prompt.length, vocab: V,
        argmax_agree: agree, max_abs_diff: maxDiff, max_abs_tandem_logit: maxRef,
        per_position: perPos, ...info,
      }));
    }
    if (opts.greedy > 0) {
      await sequence.clearHistory();
      const ids = [];
      for await (const t of sequence.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
        ids.push(t);
        if (ids.length >= opts.greedy) break;
      }
      console.log(JSON.stringify({ kind: "greedy", tokens: prompt, generated: ids.join(","),
                                   ...info }));
    }
  } else {
    if (!vocab) throw new Error("cannot tell the model's vocabulary size");
    const prompt = Array.from({ length: opts.prompt }, (_, i) => (opts.firstToken + i) % vocab);
    const prefillTps = [], decodeTps = [], decodeMsPerTok = [];
    let lastIds = null;
    for (let r = 0; r < opts.repeats; r++) {
      await sequence.clearHistory();
      const ids = [];
      const stamps = [];
      const t0 = nowMs();
      for await (const t of sequence.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
        stamps.push(nowMs());
        ids.push(t);
        if (ids.length >= opts.steps + 1) break;
      }
      if (ids.length < opts.steps + 1) throw new Error(`generation stopped after ${ids.length}`);
      const prefillMs = stamps[0] - t0;
      const decodeMs = stamps[stamps.length - 1] - stamps[0];
      const rec = {
        kind: "repeat", repeat: r, prompt_tokens: opts.prompt, decode_steps: opts.steps,
        prefill_ms: +prefillMs.toFixed(3), prefill_tok_s: +(opts.prompt / prefillMs * 1e3).toFixed(2),
        decode_ms: +decodeMs.toFixed(3), decode_tok_s: +(opts.steps / decodeMs * 1e3).toFixed(2),
        decode_ms_per_tok: +(decodeMs / opts.steps).toFixed(3),
      };
      prefillTps.push(rec.prefill_tok_s);
      decodeTps.push(rec.decode_tok_s);
      decodeMsPerTok.push(rec.decode_ms_per_tok);
      lastIds = ids;
      console.log(JSON.stringify(rec));
    }
    console.log(JSON.stringify({
      kind: "summary", prompt_tokens: opts.prompt, decode_steps: opts.steps,
      repeats: opts.repeats,
      prefill_tok_s_median: median(prefillTps),
      decode_tok_s_median: median(decodeTps),
      decode_ms_per_tok_median: median(decodeMsPerTok),
      first_prompt_token: opts.firstToken,
      generated_head: lastIds.slice(0, 8).join(","),
      ...info,
    }));
  }

  await context.dispose();
  await model.dispose();
  await llama.dispose();
}

main().catch((e) => {
  console.error(`decode_bench: ${e?.stack ?? e}`);
  process.exit(1);
});
