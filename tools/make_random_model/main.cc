// make-random-model: writes a Hugging Face model directory (config.json, generation_config.json,
// safetensors weights) with random weights of a chosen architecture and shape, for tests and
// benchmarks. Deterministic for a given --seed.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/model/quantized_writer.h"
#include "tools/make_random_model/model_spec.h"
#include "tools/make_random_model/model_writer.h"

namespace tandem::make_random_model {
namespace {

constexpr char kUsage[] = R"(usage: make-random-model --out DIR [options]

  --out DIR                 output directory (created; old weight files in it are removed)
  --arch A                  llama | mistral | qwen2 | qwen3            (default llama)
  --preset P                tiny | 125m | 1b                          (default tiny)
      tiny: 2 layers, hidden 64, 4 heads, 2 kv heads, ffn 128, vocab 256, fp32
      125m: 12 layers, hidden 768, 12 heads, 4 kv heads, ffn 2048, vocab 32000, bf16
      1b:   Llama-3.2-1B shape (16 layers, hidden 2048, 32/8 heads, head_dim 64, ffn 8192,
            vocab 128256, tied, rope_theta 500000, llama3 rope scaling), bf16
Overrides of the preset:
  --layers N --hidden N --heads N --kv-heads N --head-dim N --ffn N --vocab N --max-pos N
  --rope-theta F --rope-scaling none|llama3 --rope-scaling-factor F
  --rope-original-max-pos N  (llama3 scaling's original_max_position_embeddings)
  --tie-embeddings true|false --dtype fp32|fp16|bf16 --rms-eps F --bos-id N --eos-id N
  --seed N                  PRNG seed (default 0)
  --init-std F              std of weight matrices (default 1.5/sqrt(hidden))
  --shards N                split weights into N files with an index (default 1)
  --quantize FORMAT         write a quantized checkpoint instead (always one file):
                            gptq | awq | compressed-tensors, as model-inspect quantize writes
                            it, with --quant-bits N (default 4), --quant-group-size N (default
                            128; -1: per row), --quant-sym true|false (default true; AWQ false),
                            --quant-activations float|int8 (compressed-tensors W8A8),
                            --quant-lm-head true|false (quantize lm_head too; default false)
)";

// Space-separated, with a space at both ends, for whole-word lookup.
constexpr char kKnownFlags[] =
    " out arch preset layers hidden heads kv-heads head-dim ffn vocab max-pos rope-theta"
    " rope-scaling rope-scaling-factor rope-original-max-pos tie-embeddings dtype seed shards"
    " init-std rms-eps bos-id eos-id quantize quant-bits quant-group-size quant-sym"
    " quant-activations quant-lm-head ";

// Accepts "--name value" and "--name=value".
absl::StatusOr<std::map<std::string, std::string>> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return absl::CancelledError("help");
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::string value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
    if (!absl::StrContains(kKnownFlags, absl::StrCat(" ", name, " ")))
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    flags[name] = value;
  }
  return flags;
}

class Overrides {
 public:
  explicit Overrides(const std::map<std::string, std::string>& flags) : flags_(flags) {}

  void Int(const char* name, int64_t& field) {
    Parse(name, field, [](absl::string_view t, int64_t* v) { return absl::SimpleAtoi(t, v); });
  }
  void Uint(const char* name, uint64_t& field) {
    Parse(name, field, [](absl::string_view t, uint64_t* v) { return absl::SimpleAtoi(t, v); });
  }
  void Double(const char* name, double& field) {
    Parse(name, field, [](absl::string_view t, double* v) { return absl::SimpleAtod(t, v); });
  }
  void Bool(const char* name, bool& field) {
    Parse(name, field, [](absl::string_view t, bool* v) { return absl::SimpleAtob(t, v); });
  }
  const absl::Status& status() const { return status_; }

 private:
  // Sets `field` from flag `name` when present; the first bad value is kept as the status.
  template <typename T, typename ParseFn>
  void Parse(const char* name, T& field, ParseFn parse) {
    auto it = flags_.find(name);
    if (it == flags_.end() || !status_.ok()) return;
    if (!parse(it->second, &field)) Bad(name, it->second);
  }

  void Bad(const char* name, const std::string& value) {
    status_ = absl::InvalidArgumentError(absl::StrCat("bad value '", value, "' for --", name));
  }
  const std::map<std::string, std::string>& flags_;
  absl::Status status_;
};

absl::StatusOr<ModelSpec> SpecFromFlags(const std::map<std::string, std::string>& flags) {
  auto get = [&](const char* name, const char* fallback) {
    auto it = flags.find(name);
    return it == flags.end() ? std::string(fallback) : it->second;
  };
  absl::StatusOr<Arch> arch = ParseArch(get("arch", "llama"));
  if (!arch.ok()) return arch.status();
  absl::StatusOr<ModelSpec> spec = PresetSpec(*arch, get("preset", "tiny"));
  if (!spec.ok()) return spec.status();
  ModelSpec& s = *spec;
  Overrides o(flags);
  o.Int("layers", s.layers);
  o.Int("hidden", s.hidden);
  o.Int("heads", s.heads);
  o.Int("kv-heads", s.kv_heads);
  o.Int("head-dim", s.head_dim);
  o.Int("ffn", s.ffn);
  o.Int("vocab", s.vocab);
  o.Int("max-pos", s.max_pos);
  o.Double("rope-theta", s.rope_theta);
  o.Double("rope-scaling-factor", s.rope_scaling.factor);
  o.Int("rope-original-max-pos", s.rope_scaling.original_max_position_embeddings);
  o.Bool("tie-embeddings", s.tie_embeddings);
  o.Double("rms-eps", s.rms_eps);
  o.Int("bos-id", s.bos_id);
  o.Int("eos-id", s.eos_id);
  o.Uint("seed", s.seed);
  o.Double("init-std", s.init_std);
  if (!o.status().ok()) return o.status();
  if (flags.count("rope-scaling")) {
    const std::string& r = flags.at("rope-scaling");
    if (r != "none" && r != "llama3") {
      return absl::InvalidArgumentError("--rope-scaling must be none or llama3");
    }
    s.rope_scaling_llama3 = r == "llama3";
  }
  if (flags.count("dtype")) {
    absl::StatusOr<DType> dtype = ParseDType(flags.at("dtype"));
    if (!dtype.ok()) return dtype.status();
    s.dtype = *dtype;
  }
  absl::Status st = ValidateSpec(s);
  if (!st.ok()) return st;
  return spec;
}

// --quantize and its settings; nullopt without --quantize.
absl::StatusOr<std::optional<model::CheckpointQuantization>> QuantFromFlags(
    const std::map<std::string, std::string>& flags) {
  if (!flags.count("quantize")) {
    for (const char* name :
         {"quant-bits", "quant-group-size", "quant-sym", "quant-activations", "quant-lm-head"}) {
      if (flags.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs --quantize"));
      }
    }
    return std::nullopt;
  }
  model::CheckpointQuantization q;
  if (absl::Status s = model::ParseCheckpointFormat(flags.at("quantize"), q.format); !s.ok()) {
    return s;
  }
  q.symmetric = q.format != model::CheckpointQuantization::Format::kAwq;
  int64_t bits = q.bits, group = q.group_size;
  Overrides o(flags);
  o.Int("quant-bits", bits);
  o.Int("quant-group-size", group);
  o.Bool("quant-sym", q.symmetric);
  o.Bool("quant-lm-head", q.lm_head);
  if (!o.status().ok()) return o.status();
  if (bits < 1 || bits > 8 || group < -1 || group > (1 << 20)) {
    return absl::InvalidArgumentError("--quant-bits / --quant-group-size out of range");
  }
  q.bits = static_cast<int>(bits);
  q.group_size = static_cast<int>(group);
  if (flags.count("quant-activations")) {
    const std::string& a = flags.at("quant-activations");
    if (a != "float" && a != "int8") {
      return absl::InvalidArgumentError("--quant-activations must be float or int8");
    }
    q.int8_activations = a == "int8";
  }
  return q;
}

int Run(int argc, char** argv) {
  absl::StatusOr<std::map<std::string, std::string>> flags = ParseArgs(argc, argv);
  if (absl::IsCancelled(flags.status())) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (flags.ok() && !flags->count("out")) flags = absl::InvalidArgumentError("--out is required");
  if (!flags.ok()) {
    std::fprintf(stderr, "make-random-model: %s\n\n%s", flags.status().message().data(), kUsage);
    return 2;
  }
  absl::StatusOr<ModelSpec> spec = SpecFromFlags(*flags);
  int64_t shards = 1;
  if (spec.ok() && flags->count("shards") && !absl::SimpleAtoi(flags->at("shards"), &shards)) {
    spec = absl::InvalidArgumentError("bad value for --shards");
  }
  if (!spec.ok()) {
    std::fprintf(stderr, "make-random-model: %s\n", spec.status().ToString().c_str());
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string out = flags->at("out");
  absl::StatusOr<std::optional<model::CheckpointQuantization>> quant = QuantFromFlags(*flags);
  if (!quant.ok()) {
    std::fprintf(stderr, "make-random-model: %s\n", quant.status().ToString().c_str());
    return 2;
  }
  // A quantized checkpoint is written from the float model, made beside it first.
  const std::string float_dir = *quant ? out + ".float.tmp" : out;
  absl::Status st = WriteModelDir(*spec, float_dir, static_cast<int>(shards));
  if (st.ok() && *quant) {
    ThreadPool pool;
    st = model::WriteQuantizedCheckpoint(float_dir, out, **quant, pool);
    std::error_code ec;
    std::filesystem::remove_all(float_dir, ec);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "make-random-model: %s\n", st.ToString().c_str());
    return 1;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t params = 0;
  for (const TensorSpec& t : TensorList(*spec)) params += t.NumElements();
  std::fprintf(stderr,
               "make-random-model: wrote %s %s (%lld params, %s%s, init_std %.4g) in %.1fs\n",
               std::string(ArchModelType(spec->arch)).c_str(), out.c_str(),
               static_cast<long long>(params), std::string(DTypeName(spec->dtype)).c_str(),
               *quant ? absl::StrCat(", quantized: ", flags->at("quantize")).c_str() : "",
               spec->InitStd(), secs);
  return 0;
}

}  // namespace
}  // namespace tandem::make_random_model

int main(int argc, char** argv) { return tandem::make_random_model::Run(argc, argv); }
