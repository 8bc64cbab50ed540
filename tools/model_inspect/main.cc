// model-inspect: look inside a Hugging Face model directory and run it on the Tandem engine.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "tools/model_inspect/commands.h"

namespace {

constexpr char kUsage[] = R"(usage:
  model-inspect info --model DIR
      architecture, parameter count, dtype, context length, KV geometry
  model-inspect --kv-cache --model DIR [--context N] [--memory BYTES]
                [--kv-dtype fp32|fp16|bf16|int8|mixed [--kv-sink-tokens 4] [--kv-window-tokens 64]]
      KV-cache size: bytes per token per layer, bytes per token, bytes for one sequence of
      --context tokens (default: the model's context), tokens that fit in --memory
      (e.g. 80GiB). Needs only config.json. mixed keeps the first --kv-sink-tokens and the
      last --kv-window-tokens in fp16 (whole blocks of 16) and the rest in int8; its bytes
      per token are the average over a sequence of --context tokens.
  model-inspect --kv-cache --pruning-stats --model DIR --config FILE --prompt-file F
                [--attention-csv OUT.csv] [--attention-png OUT.png] [--kv-dtype auto|...]
      prefills F (encoded with BOS) twice, with every layer and pruned as FILE's
      kv_cache_optimization block says, and prints one line per pruned layer:
        Layer L: prune_ratio=R, similarity=S (hidden H, K K', V V')
      prune_ratio: the fraction of the prompt's positions that skip the layer (all but the
      last and the protected ones). similarity: cosine similarity of the last prompt token's
      attention output (o_proj) in the layer, pruned against full prefill; below 0.9 the line
      is marked LOW. hidden, K, V: mean cosine similarity, over the pruned positions, of the
      hidden state entering the layer and of the K and V it wrote to the cache. Then the KL
      divergence of the first-token distribution. --attention-csv/--attention-png write the
      last token's attention over the prompt, per layer and head, full and pruned.
  model-inspect forward --model DIR --tokens 1,2,3 --logits-out FILE [--kv-dtype auto|...]
                [(--prune-start-layer L | --prune-ratio R) [--prune-keep-every K]
                 [--protect-tokens N]]
      writes float32 little-endian logits of every position, shape [n_tokens, vocab].
      The prune flags run the prompt as a pruned prefill (POP): layers L.. (0-based; or the
      last R of them) skip attention and MLP for every token but the last and the positions
      of the N most frequent ids, while still writing every token's K/V; every K-th layer of
      that range runs at full depth.
  model-inspect generate --model DIR (--tokens 1,2,3 | --prompt TEXT) --max-tokens N
                [--temperature T] [--top-p P] [--top-k K] [--seed S] [--ignore-eos]
                [--presence-penalty P] [--frequency-penalty F] [--repetition-penalty R]
                [--logprobs K] [--prompt-logprobs K]
                [--kv-dtype auto|...|mixed [--kv-sink-tokens S] [--kv-window-tokens W]]
                [--evict-budget-tokens B [--evict-sink-tokens 4]] [prune flags as for forward]
      prints the generated ids comma-separated on one line (timings go to stderr); with
      --prompt (encoded with BOS as the model's config says) also the decoded text; with
      --logprobs K a line "logprob ID LOGPROB TOP_ID:LOGPROB..." per token (K alternatives);
      with --prompt-logprobs K first a line "prompt_logprob ..." per prompt token after the
      first (the prompt then runs unpruned). The prune flags prune the prompt's prefill; decode
      always runs every layer. --evict-budget-tokens evicts the oldest blocks past the sink
      tokens once the cache holds more than B tokens (kv_cache.eviction).
  model-inspect prune-eval --model DIR --text-file F (--prune-start-layer L | --prune-ratio R)
                [--prune-keep-every K] [--protect-tokens N] [--prompt-tokens 512]
                [--continuation-tokens 128] [--greedy-tokens 32] [--windows 8] [--json]
      what a pruned prefill (POP) costs in quality. F is cut into consecutive windows of a
      prompt (BOS and --prompt-tokens minus one tokens of F) and the tokens that follow it;
      each prompt is prefilled four ways and its continuation then runs at full depth on the
      cache left behind, as on a decode worker: full (every layer), pop, pop-no-boundary (the
      last prompt token pruned too) and pop-no-independent-kv (pruned tokens leave their K/V
      in pruned layers zero). Prints per prefill: bits per byte of the true continuation
      (teacher-forced), the mean KL divergence KL(full || pruned) of the first-token
      distribution in nats, how often the first greedy token equals full's, the fraction of
      the first --greedy-tokens greedy tokens equal to full's at the same position, and the
      mean length of their common prefix.
  model-inspect importance --model DIR --prompt-file F [--prompt-tokens 256]
                [--continuation-tokens 64] [--windows 8] [--epsilon 0.05] [--budget 0.1]
      layer importance with virtual gates (POP): a gate g scales each layer's attention and
      MLP outputs, separately in the prefill stage (prompt tokens 0..P-2) and in the decode
      stage (the last prompt token and the continuation, teacher-forced). Importance is
      E[(dL/dg)^2] at g = 1 by central differences (g = 1 +- epsilon), L the decode tokens'
      mean cross-entropy, the mean over windows of F cut as for prune-eval. Prints both per
      layer and recommends the longest run of last layers whose prefill importance sums to at
      most --budget of the total.
  model-inspect kv-eval --model DIR --text-file F --kv-dtype int8|mixed [--base fp16]
                [--kv-sink-tokens 4] [--kv-window-tokens 64] [--prompt-tokens 256]
                [--continuation-tokens 64] [--windows 8]
      what a compressed KV cache costs against a --base one, on windows of F cut as for
      prune-eval. Each prompt is prefilled into both caches; the base cache's greedy tokens
      are fed to both (teacher-forced: per decode step, the cosine similarity of each layer's
      attention output (o_proj) and the argmax and logit agreement), and the evaluated cache
      also generates on its own (free-running greedy agreement with the base, position by
      position, over --continuation-tokens tokens).
  model-inspect quantize --model DIR --out DIR2 [--format gptq|awq|compressed-tensors]
                [--bits 4] [--group-size 128] [--sym true|false] [--activations float|int8]
                [--lm-head true|false]
      writes DIR's float model as a quantized checkpoint that GPTQ, AWQ and compressed-tensors
      loaders (vLLM, SGLang, transformers) read: the decoder layers' matrices rounded to
      nearest per row and group of --group-size input columns (-1: one group per row), f16
      scales, with zero points unless --sym true (AWQ: always zero points); embeddings, norms
      and lm_head as stored (--lm-head true quantizes lm_head too: GPTQ lm_head, or
      compressed-tensors without it in ignore; a tied head is written untied). gptq: 4 or 8 bits (v1 zeros); awq: 4 bits, GEMM packing;
      compressed-tensors: 8 bits int-quantized (--activations int8: W8A8, activations int8 per
      token) or 4 bits pack-quantized. Loading DIR2 computes what --weight-quantization computes
      on DIR with the same bits, group and zero points.
  model-inspect tokenize --model DIR --text-file F
      for each line of F (without its newline) prints its ids comma-separated, one line each,
      no special tokens added. Needs only tokenizer.json (+ tokenizer_config.json).
  model-inspect detokenize --model DIR --ids 1,2,3 [--skip-special-tokens]
      prints the decoded text
Common: --threads N (default: TANDEM_NUM_THREADS or all cores);
        --weight-memory mmap|hugepages (default mmap: zero-copy views of the files;
        hugepages copies the matrices into 2 MiB pages packed for the GEMM kernels:
        faster decode and prefill, batch-invariant results, more memory);
        --weight-quantization none|int8|int4 [--weight-quantization-group-size G]
        (quantize the decoder layers at load, as model.weight_quantization);
        --activation-quantization none|int8 (as model.activation_quantization);
        --lm-head-quantization none|int8 (as model.lm_head_quantization);
        --cpu-gemm auto|tandem|onednn (default auto, as model.cpu_gemm).
)";

}  // namespace

int main(int argc, char** argv) {
  auto args = tandem::CliArgs::Parse(
      argc, argv,
      {"kv-cache", "pruning-stats", "ignore-eos", "skip-special-tokens", "json", "help"});
  if (!args.ok()) {
    std::fprintf(stderr, "model-inspect: %s\n%s", std::string(args.status().message()).c_str(),
                 kUsage);
    return 2;
  }
  const auto& pos = args->positional();
  std::string command = pos.empty() ? "" : pos[0];
  if (args->Has("help") || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  absl::Status status;
  if (args->Has("kv-cache") && args->Has("pruning-stats") && command.empty()) {
    status = tandem::tools::RunPruningStats(*args);
  } else if (args->Has("kv-cache") && (command.empty() || command == "info")) {
    status = tandem::tools::RunKvCache(*args);
  } else if (command == "info") {
    status = tandem::tools::RunInfo(*args);
  } else if (command == "forward") {
    status = tandem::tools::RunForward(*args);
  } else if (command == "tokenize") {
    status = tandem::tools::RunTokenize(*args);
  } else if (command == "detokenize") {
    status = tandem::tools::RunDetokenize(*args);
  } else if (command == "importance") {
    status = tandem::tools::RunImportance(*args);
  } else if (command == "prune-eval") {
    status = tandem::tools::RunPruneEval(*args);
  } else if (command == "kv-eval") {
    status = tandem::tools::RunKvEval(*args);
  } else if (command == "quantize") {
    status = tandem::tools::RunQuantize(*args);
  } else if (command == "generate") {
    status = tandem::tools::RunGenerate(*args);
  } else {
    std::fprintf(stderr, "model-inspect: unknown command \"%s\"\n%s", command.c_str(), kUsage);
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "model-inspect: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
