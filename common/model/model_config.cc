#include "common/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "common/util/file_util.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"

namespace tandem::model {
namespace {

using nlohmann::json;

// Bounds that reject absurd configs before anything is allocated from them.
constexpr int64_t kMaxHidden = 1 << 16;
constexpr int64_t kMaxIntermediate = 1 << 18;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxPositions = int64_t{1} << 24;

absl::StatusOr<Architecture> ParseArchitecture(const json& j, std::string_view source,
                                               std::string* name) {
  auto it = j.find("architectures");
  if (it == j.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(source), ": key \"architectures\" must be a non-empty list of strings"));
  }
  *name = (*it)[0].get<std::string>();
  if (*name == "LlamaForCausalLM") return Architecture::kLlama;
  if (*name == "MistralForCausalLM") return Architecture::kMistral;
  if (*name == "Qwen2ForCausalLM") return Architecture::kQwen2;
  if (*name == "Qwen3ForCausalLM") return Architecture::kQwen3;
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(source), ": unsupported architecture \"", *name,
      "\" (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)"));
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const json& j, std::string_view source) {
  RopeScaling rs;
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return rs;
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": key \"rope_scaling\" must be an object or null"));
  }
  std::string src = absl::StrCat(std::string(source), " rope_scaling");
  JsonFields f(*it, src);
  std::string type;
  if (f.HasValue("rope_type")) {
    TANDEM_ASSIGN_OR_RETURN(type, f.String("rope_type"));
  } else {
    TANDEM_ASSIGN_OR_RETURN(type, f.StringOr("type", "default"));
  }
  if (type == "default") return rs;
  TANDEM_ASSIGN_OR_RETURN(rs.factor, f.Number("factor", 1e-3, 1e6));
  if (type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
    TANDEM_ASSIGN_OR_RETURN(rs.low_freq_factor, f.Number("low_freq_factor", 1e-6, 1e6));
    TANDEM_ASSIGN_OR_RETURN(rs.high_freq_factor, f.Number("high_freq_factor", 1e-6, 1e6));
    TANDEM_ASSIGN_OR_RETURN(rs.original_max_position_embeddings,
                            f.Int("original_max_position_embeddings", 1, kMaxPositions));
    if (rs.high_freq_factor <= rs.low_freq_factor) {
      return f.Error("high_freq_factor", "must be greater than low_freq_factor");
    }
  } else {
    return absl::UnimplementedError(absl::StrCat(std::string(source), ": rope_scaling type \"",
                                                 type,
                                                 "\" is not supported (default, linear, llama3)"));
  }
  return rs;
}

// eos_token_id may be an integer, a list of integers or null.
absl::Status ParseEosIds(const json& j, std::string_view source, std::vector<int32_t>* out) {
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  std::vector<int32_t> ids;
  auto add = [&](const json& v) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxVocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          std::string(source), ": key \"eos_token_id\" must hold token ids, got ", v.dump()));
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const auto& v : *it) TANDEM_RETURN_IF_ERROR(add(v));
  } else {
    TANDEM_RETURN_IF_ERROR(add(*it));
  }
  *out = std::move(ids);
  return absl::OkStatus();
}

absl::Status ParseShape(const JsonFields& f, ModelConfig& c) {
  TANDEM_ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size", 1, kMaxVocab));
  TANDEM_ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size", 1, kMaxHidden));
  TANDEM_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", 1, kMaxIntermediate));
  TANDEM_ASSIGN_OR_RETURN(int64_t layers, f.Int("num_hidden_layers", 1, kMaxLayers));
  TANDEM_ASSIGN_OR_RETURN(int64_t heads, f.Int("num_attention_heads", 1, kMaxHeads));
  TANDEM_ASSIGN_OR_RETURN(int64_t kv_heads, f.IntOr("num_key_value_heads", heads, 1, kMaxHeads));
  c.num_layers = static_cast<int>(layers);
  c.num_heads = static_cast<int>(heads);
  c.num_kv_heads = static_cast<int>(kv_heads);
  if (heads % kv_heads != 0) {
    return f.Error("num_key_value_heads",
                   absl::StrCat("(", kv_heads, ") must divide num_attention_heads (", heads, ")"));
  }
  int64_t default_head_dim = c.hidden_size / heads;
  TANDEM_ASSIGN_OR_RETURN(int64_t head_dim, f.IntOr("head_dim", default_head_dim, 1, kMaxHeadDim));
  if (!f.HasValue("head_dim") && c.hidden_size % heads != 0) {
    return f.Error("hidden_size",
                   "must be divisible by num_attention_heads when head_dim is unset");
  }
  if (head_dim % 2 != 0) return f.Error("head_dim", "must be even for rotary embeddings");
  c.head_dim = static_cast<int>(head_dim);
  TANDEM_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          f.Int("max_position_embeddings", 1, kMaxPositions));
  return absl::OkStatus();
}

}  // namespace

std::string_view ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kMistral:
      return "mistral";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
  }
  return "unknown";
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view json_text,
                                                  std::string_view source) {
  TANDEM_ASSIGN_OR_RETURN(json j, ParseJsonObject(json_text, source));
  JsonFields f(j, source);
  ModelConfig c;
  TANDEM_ASSIGN_OR_RETURN(c.architecture, ParseArchitecture(j, source, &c.architecture_name));
  TANDEM_ASSIGN_OR_RETURN(c.model_type, f.StringOr("model_type", ""));
  TANDEM_RETURN_IF_ERROR(ParseShape(f, c));
  TANDEM_ASSIGN_OR_RETURN(c.rms_norm_eps, f.NumberOr("rms_norm_eps", 1e-6, 0, 1));
  TANDEM_ASSIGN_OR_RETURN(c.rope_theta, f.NumberOr("rope_theta", 10000.0, 1e-3, 1e12));
  TANDEM_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j, source));
  TANDEM_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.BoolOr("tie_word_embeddings", false));
  TANDEM_ASSIGN_OR_RETURN(bool bias, f.BoolOr("attention_bias", false));
  c.attention_bias = bias || c.architecture == Architecture::kQwen2;
  c.qk_norm = c.architecture == Architecture::kQwen3;
  TANDEM_ASSIGN_OR_RETURN(bool use_sliding, f.BoolOr("use_sliding_window", true));
  if (use_sliding && c.architecture == Architecture::kMistral) {
    TANDEM_ASSIGN_OR_RETURN(c.sliding_window, f.IntOr("sliding_window", 0, 0, kMaxPositions));
  }
  std::string dtype_name;
  TANDEM_ASSIGN_OR_RETURN(dtype_name, f.StringOr("torch_dtype", "bfloat16"));
  auto dtype = ParseDType(dtype_name);
  if (!dtype.ok()) return f.Error("torch_dtype", std::string(dtype.status().message()));
  c.torch_dtype = *dtype;
  TANDEM_ASSIGN_OR_RETURN(c.quantization, ParseQuantizationConfig(j, source));
  TANDEM_ASSIGN_OR_RETURN(int64_t bos, f.IntOr("bos_token_id", -1, -1, kMaxVocab));
  c.bos_token_id = static_cast<int32_t>(bos);
  TANDEM_RETURN_IF_ERROR(ParseEosIds(j, source, &c.eos_token_ids));
  return c;
}

absl::Status ModelConfig::MergeGenerationConfig(std::string_view json_text,
                                                std::string_view source) {
  TANDEM_ASSIGN_OR_RETURN(json j, ParseJsonObject(json_text, source));
  JsonFields f(j, source);
  TANDEM_RETURN_IF_ERROR(ParseEosIds(j, source, &eos_token_ids));
  TANDEM_ASSIGN_OR_RETURN(int64_t bos, f.IntOr("bos_token_id", bos_token_id, -1, kMaxVocab));
  bos_token_id = static_cast<int32_t>(bos);
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ModelConfig::FromDirectory(const std::string& dir) {
  std::string path = dir + "/config.json";
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 16 << 20));
  TANDEM_ASSIGN_OR_RETURN(ModelConfig c, FromJson(text, path));
  std::string gen_path = dir + "/generation_config.json";
  if (FileExists(gen_path)) {
    TANDEM_ASSIGN_OR_RETURN(std::string gen, ReadFileToString(gen_path, 16 << 20));
    TANDEM_RETURN_IF_ERROR(c.MergeGenerationConfig(gen, gen_path));
  }
  return c;
}

int64_t ModelConfig::ContextLength() const {
  return sliding_window > 0 ? std::min(max_position_embeddings, sliding_window)
                            : max_position_embeddings;
}

int64_t ModelConfig::ParameterCount() const {
  int64_t q = int64_t{num_heads} * head_dim, kv = int64_t{num_kv_heads} * head_dim;
  int64_t attn = hidden_size * (q + 2 * kv) + q * hidden_size;
  if (attention_bias) attn += q + 2 * kv;
  if (qk_norm) attn += 2 * head_dim;
  int64_t mlp = 3 * hidden_size * intermediate_size;
  int64_t layer = attn + mlp + 2 * hidden_size;
  int64_t embed = vocab_size * hidden_size;
  return embed * (tie_word_embeddings ? 1 : 2) + num_layers * layer + hidden_size;
}

kv::KvLayout ModelConfig::KvLayoutFor(DType kv_dtype, int block_size) const {
  return kv::KvLayout{.num_layers = num_layers,
                      .num_kv_heads = num_kv_heads,
                      .head_dim = head_dim,
                      .block_size = block_size,
                      .dtype = kv_dtype};
}

std::vector<float> ModelConfig::RopeInvFreq() const {
  int half = head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(rope_theta, (2.0 * i) / head_dim);
    if (rope_scaling.type == RopeScaling::Type::kLinear) {
      f /= rope_scaling.factor;
    } else if (rope_scaling.type == RopeScaling::Type::kLlama3) {
      // Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
      const RopeScaling& rs = rope_scaling;
      double old_len = static_cast<double>(rs.original_max_position_embeddings);
      double low_wavelen = old_len / rs.low_freq_factor;
      double high_wavelen = old_len / rs.high_freq_factor;
      double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= rs.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth =
            (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

bool ModelConfig::IsEos(int32_t token) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

}  // namespace tandem::model
