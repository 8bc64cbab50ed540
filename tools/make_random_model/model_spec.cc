#include "tools/make_random_model/model_spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem::make_random_model {
namespace {

// The transformers release whose config layout this tool reproduces.
constexpr char kTransformersVersion[] = "4.51.0";

std::string_view ArchClassName(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "LlamaForCausalLM";
    case Arch::kMistral:
      return "MistralForCausalLM";
    case Arch::kQwen2:
      return "Qwen2ForCausalLM";
    case Arch::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "";
}

std::string_view TorchDtypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kI8:  // KV only; ParseDType never yields it
      break;
  }
  return "";
}

nlohmann::json RopeScalingJson(const ModelSpec& spec) {
  if (!spec.rope_scaling_llama3) return nullptr;
  const Llama3RopeScaling& r = spec.rope_scaling;
  return {{"factor", r.factor},
          {"high_freq_factor", r.high_freq_factor},
          {"low_freq_factor", r.low_freq_factor},
          {"original_max_position_embeddings", r.original_max_position_embeddings},
          {"rope_type", "llama3"}};
}

}  // namespace

absl::StatusOr<Arch> ParseArch(std::string_view name) {
  if (name == "llama") return Arch::kLlama;
  if (name == "mistral") return Arch::kMistral;
  if (name == "qwen2") return Arch::kQwen2;
  if (name == "qwen3") return Arch::kQwen3;
  return absl::InvalidArgumentError(absl::StrCat("unknown --arch '", std::string(name),
                                                 "' (expected llama, mistral, qwen2 or qwen3)"));
}

std::string_view ArchModelType(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "llama";
    case Arch::kMistral:
      return "mistral";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
  }
  return "";
}

double ModelSpec::InitStd() const {
  return init_std > 0 ? init_std : kDefaultInitGain / std::sqrt(static_cast<double>(hidden));
}

absl::StatusOr<ModelSpec> PresetSpec(Arch arch, std::string_view preset) {
  ModelSpec s;
  s.arch = arch;
  const bool qwen = arch == Arch::kQwen2 || arch == Arch::kQwen3;
  s.rope_theta = qwen ? 1e6 : 1e4;
  s.rms_eps = qwen ? 1e-6 : 1e-5;
  if (preset == "tiny") return s;  // The struct defaults.
  if (preset == "125m") {
    s.layers = 12;
    s.hidden = 768;
    s.heads = 12;
    s.kv_heads = 4;
    s.ffn = 2048;
    s.vocab = 32000;
    s.max_pos = 4096;
    s.dtype = DType::kBF16;
    return s;
  }
  if (preset == "1b") {  // Llama-3.2-1B.
    s.layers = 16;
    s.hidden = 2048;
    s.heads = 32;
    s.kv_heads = 8;
    s.head_dim = 64;
    s.ffn = 8192;
    s.vocab = 128256;
    s.max_pos = 131072;
    s.tie_embeddings = true;
    s.rope_theta = 500000.0;
    s.rope_scaling_llama3 = true;
    s.rope_scaling = Llama3RopeScaling{};
    s.rms_eps = 1e-5;
    s.bos_id = 128000;
    s.eos_id = 128001;
    s.dtype = DType::kBF16;
    return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --preset '", std::string(preset), "' (expected tiny, 125m or 1b)"));
}

absl::Status ValidateSpec(const ModelSpec& s) {
  auto positive = [](int64_t v, const char* name) -> absl::Status {
    if (v <= 0) return absl::InvalidArgumentError(absl::StrCat(name, " must be positive"));
    return absl::OkStatus();
  };
  for (auto [v, name] : {std::pair{s.layers, "--layers"},
                         {s.hidden, "--hidden"},
                         {s.heads, "--heads"},
                         {s.kv_heads, "--kv-heads"},
                         {s.ffn, "--ffn"},
                         {s.vocab, "--vocab"},
                         {s.max_pos, "--max-pos"}}) {
    absl::Status st = positive(v, name);
    if (!st.ok()) return st;
  }
  if (s.heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError("--heads must be a multiple of --kv-heads");
  }
  if (s.head_dim == 0 && s.hidden % s.heads != 0) {
    return absl::InvalidArgumentError("--hidden must be a multiple of --heads (or set --head-dim)");
  }
  if (s.HeadDim() <= 0 || s.HeadDim() % 2 != 0) {
    return absl::InvalidArgumentError("head_dim must be positive and even (RoPE pairs)");
  }
  if (s.rope_theta <= 0 || s.rms_eps <= 0 || s.init_std < 0) {
    return absl::InvalidArgumentError(
        "--rope-theta and --rms-eps must be positive, --init-std not negative");
  }
  if (s.bos_id < 0 || s.bos_id >= s.vocab || s.eos_id < 0 || s.eos_id >= s.vocab) {
    return absl::InvalidArgumentError("--bos-id and --eos-id must be < --vocab");
  }
  if (s.rope_scaling_llama3 &&
      (s.rope_scaling.factor <= 0 || s.rope_scaling.original_max_position_embeddings <= 0 ||
       s.rope_scaling.high_freq_factor <= s.rope_scaling.low_freq_factor)) {
    return absl::InvalidArgumentError("invalid llama3 rope scaling parameters");
  }
  return absl::OkStatus();
}

nlohmann::json ConfigJson(const ModelSpec& s) {
  const int64_t head_dim = s.HeadDim();
  nlohmann::json c;
  c["architectures"] = {ArchClassName(s.arch)};
  c["model_type"] = ArchModelType(s.arch);
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = s.bos_id;
  c["eos_token_id"] = s.eos_id;
  c["hidden_act"] = "silu";
  c["hidden_size"] = s.hidden;
  c["initializer_range"] = s.InitStd();
  c["intermediate_size"] = s.ffn;
  c["max_position_embeddings"] = s.max_pos;
  c["num_attention_heads"] = s.heads;
  c["num_hidden_layers"] = s.layers;
  c["num_key_value_heads"] = s.kv_heads;
  c["rms_norm_eps"] = s.rms_eps;
  c["rope_theta"] = s.rope_theta;
  c["tie_word_embeddings"] = s.tie_embeddings;
  c["torch_dtype"] = TorchDtypeName(s.dtype);
  c["transformers_version"] = kTransformersVersion;
  c["use_cache"] = true;
  c["vocab_size"] = s.vocab;
  if (head_dim * s.heads != s.hidden || s.arch == Arch::kQwen3) c["head_dim"] = head_dim;
  switch (s.arch) {
    case Arch::kLlama:
      c["attention_bias"] = false;
      c["mlp_bias"] = false;
      c["pretraining_tp"] = 1;
      c["rope_scaling"] = RopeScalingJson(s);
      break;
    case Arch::kMistral:
      // MistralConfig has no rope_scaling attribute; only written when asked for.
      if (s.rope_scaling_llama3) c["rope_scaling"] = RopeScalingJson(s);
      c["sliding_window"] = nullptr;
      break;
    case Arch::kQwen2:
      // Qwen2 always has q/k/v biases and no flag for them in the config.
      c["max_window_layers"] = s.layers;
      c["rope_scaling"] = RopeScalingJson(s);
      c["sliding_window"] = nullptr;
      c["use_sliding_window"] = false;
      break;
    case Arch::kQwen3:
      c["attention_bias"] = false;
      c["max_window_layers"] = s.layers;
      c["rope_scaling"] = RopeScalingJson(s);
      c["sliding_window"] = nullptr;
      c["use_sliding_window"] = false;
      break;
  }
  return c;
}

nlohmann::json GenerationConfigJson(const ModelSpec& s) {
  return {{"_from_model_config", true},
          {"bos_token_id", s.bos_id},
          {"eos_token_id", s.eos_id},
          {"transformers_version", kTransformersVersion}};
}

int64_t TensorSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorSpec> TensorList(const ModelSpec& s) {
  const int64_t hd = s.HeadDim();
  const int64_t q_out = s.heads * hd;
  const int64_t kv_out = s.kv_heads * hd;
  const bool qkv_bias = s.arch == Arch::kQwen2;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {s.vocab, s.hidden}, InitKind::kMatrix});
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    auto proj = [&](const char* name, int64_t out, int64_t in, bool bias) {
      t.push_back({absl::StrCat(p, name, ".weight"), {out, in}, InitKind::kMatrix});
      if (bias) t.push_back({absl::StrCat(p, name, ".bias"), {out}, InitKind::kBias});
    };
    proj("self_attn.q_proj", q_out, s.hidden, qkv_bias);
    proj("self_attn.k_proj", kv_out, s.hidden, qkv_bias);
    proj("self_attn.v_proj", kv_out, s.hidden, qkv_bias);
    proj("self_attn.o_proj", s.hidden, q_out, false);
    if (s.arch == Arch::kQwen3) {
      t.push_back({p + "self_attn.q_norm.weight", {hd}, InitKind::kNorm});
      t.push_back({p + "self_attn.k_norm.weight", {hd}, InitKind::kNorm});
    }
    proj("mlp.gate_proj", s.ffn, s.hidden, false);
    proj("mlp.up_proj", s.ffn, s.hidden, false);
    proj("mlp.down_proj", s.hidden, s.ffn, false);
    t.push_back({p + "input_layernorm.weight", {s.hidden}, InitKind::kNorm});
    t.push_back({p + "post_attention_layernorm.weight", {s.hidden}, InitKind::kNorm});
  }
  t.push_back({"model.norm.weight", {s.hidden}, InitKind::kNorm});
  if (!s.tie_embeddings) t.push_back({"lm_head.weight", {s.vocab, s.hidden}, InitKind::kMatrix});
  return t;
}

}  // namespace tandem::make_random_model
