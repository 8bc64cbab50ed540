#include "common/model/quantized_writer.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/quant_pack.h"
#include "common/model/model_weights.h"
#include "common/model/safetensors.h"
#include "common/util/file_util.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

using Format = CheckpointQuantization::Format;
using json = nlohmann::json;

// The decoder layers' linears: what every format quantizes.
bool IsDecoderLinear(const std::string& name) {
  if (!absl::StartsWith(name, "model.layers.")) return false;
  for (const char* p :
       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
    if (absl::EndsWith(name, absl::StrCat(".", p, ".weight"))) return true;
  }
  return false;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

absl::Status CheckSettings(const CheckpointQuantization& q) {
  auto refuse = [](const std::string& why) { return absl::InvalidArgumentError(why); };
  switch (q.format) {
    case Format::kGptq:
      if (q.bits != 4 && q.bits != 8) return refuse("GPTQ: --bits must be 4 or 8");
      if (q.int8_activations)
        return refuse("GPTQ is weight-only: int8 activations need compressed-tensors");
      break;
    case Format::kAwq:
      if (q.bits != 4) return refuse("AWQ: --bits must be 4");
      if (q.group_size <= 0) return refuse("AWQ: --group-size must be > 0 (AWQ scales groups)");
      if (q.int8_activations)
        return refuse("AWQ is weight-only: int8 activations need compressed-tensors");
      if (q.lm_head) return refuse("AWQ leaves lm_head unquantized");
      break;
    case Format::kCompressedTensors:
      if (q.bits != 4 && q.bits != 8) return refuse("compressed-tensors: --bits must be 4 or 8");
      if (q.bits == 4 && !q.symmetric) {
        return refuse("compressed-tensors: 4-bit (pack-quantized) weights are written symmetric");
      }
      if (q.int8_activations && q.bits != 8) return refuse("W8A8 needs --bits 8");
      break;
  }
  if (q.group_size != -1 && q.group_size <= 0) return refuse("--group-size must be -1 or > 0");
  return absl::OkStatus();
}

// One float matrix [rows, cols] quantized row by row (kernels::QuantizeRow): codes [rows][cols],
// scales and zeros [rows][groups].
struct Quantized {
  int64_t rows = 0, cols = 0, groups = 0;
  std::vector<uint8_t> codes, zeros;
  std::vector<uint16_t> scales;  // f16
};

Quantized Quantize(const kernels::QuantFormat& f, const float* w, int64_t rows, int64_t cols,
                   ThreadPool& pool) {
  Quantized out;
  out.rows = rows;
  out.cols = cols;
  out.groups = f.group_size > 0 ? cols / f.group_size : 1;
  out.codes.resize(rows * cols);
  out.zeros.resize(rows * out.groups);
  out.scales.resize(rows * out.groups);
  pool.ParallelFor(rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> scales(out.groups);
    for (int64_t r = r0; r < r1; ++r) {
      kernels::QuantizeRow(f, w + r * cols, cols, out.codes.data() + r * cols, scales.data(),
                           out.zeros.data() + r * out.groups);
      for (int64_t g = 0; g < out.groups; ++g) {
        out.scales[r * out.groups + g] = F32ToF16(scales[g]);
        if (!f.has_zero) out.zeros[r * out.groups + g] = static_cast<uint8_t>(1 << (f.bits - 1));
      }
    }
  });
  return out;
}

// The scales [groups, rows] (GPTQ and AWQ store them transposed).
std::vector<uint16_t> ScalesByGroup(const Quantized& m) {
  std::vector<uint16_t> out(m.groups * m.rows);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t g = 0; g < m.groups; ++g) out[g * m.rows + r] = m.scales[r * m.groups + g];
  }
  return out;
}

// GPTQ v1: qweight packs input k of output n at bits (k % pf) * bits of [k / pf][n]; qzeros
// packs zero - 1 of output n at bits (n % pf) * bits of [g][n / pf].
absl::Status WriteGptq(const std::string& prefix, const Quantized& m, int bits,
                       std::vector<SafetensorsTensor>& out) {
  const int pf = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  if (m.rows % pf != 0 || m.cols % pf != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ": shape [", m.rows, ", ", m.cols, "] is not a multiple of ", pf,
                     " in both dimensions, as ", bits, "-bit GPTQ packing needs"));
  }
  std::vector<uint32_t> qweight(m.cols / pf * m.rows, 0), qzeros(m.groups * m.rows / pf, 0);
  std::vector<int32_t> g_idx(m.cols);
  for (int64_t n = 0; n < m.rows; ++n) {
    for (int64_t k = 0; k < m.cols; ++k) {
      qweight[k / pf * m.rows + n] |= uint32_t{m.codes[n * m.cols + k]} << (k % pf * bits);
    }
    for (int64_t g = 0; g < m.groups; ++g) {
      const uint32_t stored = (uint32_t{m.zeros[n * m.groups + g]} - 1) & mask;
      qzeros[g * (m.rows / pf) + n / pf] |= stored << (n % pf * bits);
    }
  }
  for (int64_t k = 0; k < m.cols; ++k) g_idx[k] = static_cast<int32_t>(k / (m.cols / m.groups));
  out.push_back({prefix + ".qweight", StDType::kI32, {m.cols / pf, m.rows}, Bytes(qweight)});
  out.push_back({prefix + ".qzeros", StDType::kI32, {m.groups, m.rows / pf}, Bytes(qzeros)});
  out.push_back({prefix + ".scales", StDType::kF16, {m.groups, m.rows}, Bytes(ScalesByGroup(m))});
  out.push_back({prefix + ".g_idx", StDType::kI32, {m.cols}, Bytes(g_idx)});
  return absl::OkStatus();
}

// AWQ GEMM: qweight [cols, rows / 8] holds output n of input k in nibble i of [k][n / 8], n % 8
// being {0, 2, 4, 6, 1, 3, 5, 7}[i]; qzeros [groups, rows / 8] the same way.
absl::Status WriteAwq(const std::string& prefix, const Quantized& m,
                      std::vector<SafetensorsTensor>& out) {
  static constexpr int kNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // of output n % 8
  if (m.rows % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": output dimension ", m.rows, " is not a multiple of 8, as AWQ packing needs"));
  }
  const int64_t words = m.rows / 8;
  std::vector<uint32_t> qweight(m.cols * words, 0), qzeros(m.groups * words, 0);
  for (int64_t n = 0; n < m.rows; ++n) {
    const int shift = 4 * kNibble[n % 8];
    for (int64_t k = 0; k < m.cols; ++k) {
      qweight[k * words + n / 8] |= uint32_t{m.codes[n * m.cols + k]} << shift;
    }
    for (int64_t g = 0; g < m.groups; ++g) {
      qzeros[g * words + n / 8] |= uint32_t{m.zeros[n * m.groups + g]} << shift;
    }
  }
  out.push_back({prefix + ".qweight", StDType::kI32, {m.cols, words}, Bytes(qweight)});
  out.push_back({prefix + ".qzeros", StDType::kI32, {m.groups, words}, Bytes(qzeros)});
  out.push_back({prefix + ".scales", StDType::kF16, {m.groups, m.rows}, Bytes(ScalesByGroup(m))});
  return absl::OkStatus();
}

// compressed-tensors: 8 bits int-quantized (weight int8 = code - 128, weight_zero_point int8
// when asymmetric); 4 bits pack-quantized (weight_packed int32 [rows, ceil(cols / 8)], input k
// in bits (k % 8) * 4 of word k / 8, stored as the code, i.e. the value plus 8; weight_shape).
// weight_scale [rows, groups].
void WriteCompressedTensors(const std::string& prefix, const Quantized& m, int bits, bool symmetric,
                            std::vector<SafetensorsTensor>& out) {
  const int64_t offset = int64_t{1} << (bits - 1);
  if (bits == 8) {
    std::vector<int8_t> weight(m.rows * m.cols);
    for (size_t i = 0; i < weight.size(); ++i) {
      weight[i] = static_cast<int8_t>(m.codes[i] - offset);
    }
    out.push_back({prefix + ".weight", StDType::kI8, {m.rows, m.cols}, Bytes(weight)});
  } else {
    const int64_t words = (m.cols + 7) / 8;
    std::vector<uint32_t> packed(m.rows * words, 0);
    for (int64_t n = 0; n < m.rows; ++n) {
      for (int64_t k = 0; k < m.cols; ++k) {
        packed[n * words + k / 8] |= uint32_t{m.codes[n * m.cols + k]} << (k % 8 * 4);
      }
    }
    out.push_back({prefix + ".weight_packed", StDType::kI32, {m.rows, words}, Bytes(packed)});
    const std::vector<int64_t> shape = {m.rows, m.cols};
    out.push_back({prefix + ".weight_shape", StDType::kI64, {2}, Bytes(shape)});
  }
  out.push_back({prefix + ".weight_scale", StDType::kF16, {m.rows, m.groups}, Bytes(m.scales)});
  if (!symmetric) {
    std::vector<int8_t> zp(m.zeros.size());
    for (size_t i = 0; i < zp.size(); ++i) zp[i] = static_cast<int8_t>(m.zeros[i] - offset);
    out.push_back({prefix + ".weight_zero_point", StDType::kI8, {m.rows, m.groups}, Bytes(zp)});
  }
}

json QuantizationConfigJson(const CheckpointQuantization& q) {
  switch (q.format) {
    case Format::kGptq:
      return {{"quant_method", "gptq"}, {"bits", q.bits},     {"group_size", q.group_size},
              {"desc_act", false},      {"sym", q.symmetric}, {"checkpoint_format", "gptq"},
              {"lm_head", q.lm_head}};
    case Format::kAwq:
      return {{"quant_method", "awq"},
              {"bits", 4},
              {"group_size", q.group_size},
              {"zero_point", true},
              {"version", "gemm"}};
    case Format::kCompressedTensors: {
      json weights = {{"num_bits", q.bits},
                      {"type", "int"},
                      {"symmetric", q.symmetric},
                      {"dynamic", false},
                      {"strategy", q.group_size > 0 ? "group" : "channel"}};
      if (q.group_size > 0) weights["group_size"] = q.group_size;
      json scheme = {{"targets", {"Linear"}}, {"weights", weights}};
      if (q.int8_activations) {
        scheme["input_activations"] = {{"num_bits", 8},
                                       {"type", "int"},
                                       {"symmetric", true},
                                       {"dynamic", true},
                                       {"strategy", "token"}};
      }
      return {{"quant_method", "compressed-tensors"},
              {"format", q.bits == 8 ? "int-quantized" : "pack-quantized"},
              {"config_groups", {{"group_0", scheme}}},
              {"ignore", q.lm_head ? json::array() : json::array({"lm_head"})}};
    }
  }
  return nullptr;
}

}  // namespace

absl::Status ParseCheckpointFormat(const std::string& name, Format& format) {
  if (name == "gptq") {
    format = Format::kGptq;
  } else if (name == "awq") {
    format = Format::kAwq;
  } else if (name == "compressed-tensors") {
    format = Format::kCompressedTensors;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantized checkpoint format must be gptq, awq or compressed-tensors, got \"", name, "\""));
  }
  return absl::OkStatus();
}

absl::Status WriteQuantizedCheckpoint(const std::string& in_dir, const std::string& out_dir,
                                      const CheckpointQuantization& q, ThreadPool& pool) {
  TANDEM_RETURN_IF_ERROR(CheckSettings(q));
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::equivalent(in_dir, out_dir, ec)) {
    return absl::InvalidArgumentError("the output directory must differ from the model's");
  }
  TANDEM_ASSIGN_OR_RETURN(std::string config_text,
                          ReadFileToString(in_dir + "/config.json", 1 << 20));
  TANDEM_ASSIGN_OR_RETURN(json config, ParseJsonObject(config_text, in_dir + "/config.json"));
  if (config.contains("quantization_config") && !config["quantization_config"].is_null()) {
    return absl::InvalidArgumentError(
        absl::StrCat(in_dir, " is already quantized; quantize a float (bf16/f16/f32) model"));
  }
  const kernels::QuantFormat format{
      .bits = q.bits, .group_size = q.group_size, .has_zero = !q.symmetric};
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> paths, ListWeightFiles(in_dir));
  const bool tied = config.value("tie_word_embeddings", false);
  std::vector<SafetensorsTensor> out;
  for (const std::string& path : paths) {
    TANDEM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    for (const TensorEntry& e : file->tensors()) {
      const uint8_t* data = file->Data(e);
      const std::string raw(reinterpret_cast<const char*>(data), e.end - e.begin);
      // With a quantized head, a tied model's head is the embedding, quantized as lm_head.
      const bool head = q.lm_head && (e.name == "lm_head.weight" ||
                                      (tied && e.name == "model.embed_tokens.weight"));
      if (tied && q.lm_head && e.name == "lm_head.weight") continue;  // the embedding's copy
      if (!IsDecoderLinear(e.name) && !head) {
        out.push_back({e.name, e.dtype, e.shape, raw});
        continue;
      }
      if (head && e.name != "lm_head.weight") out.push_back({e.name, e.dtype, e.shape, raw});
      DType dtype;
      switch (e.dtype) {
        case StDType::kF32:
          dtype = DType::kF32;
          break;
        case StDType::kF16:
          dtype = DType::kF16;
          break;
        case StDType::kBF16:
          dtype = DType::kBF16;
          break;
        default:
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": tensor \"", e.name, "\" has dtype ", std::string(StDTypeName(e.dtype)),
              "; only float matrices can be quantized"));
      }
      if (e.shape.size() != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor \"", e.name, "\" is not a matrix"));
      }
      const int64_t rows = e.shape[0], cols = e.shape[1];
      if (absl::Status s = kernels::CheckQuantFormat(format, cols); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot quantize \"", e.name, "\": ", s.message()));
      }
      std::vector<float> w(rows * cols);
      ToFloat(dtype, raw.data(), w.data(), w.size());
      const Quantized m = Quantize(format, w.data(), rows, cols, pool);
      const std::string prefix = head ? "lm_head" : e.name.substr(0, e.name.size() - 7);
      switch (q.format) {
        case Format::kGptq:
          TANDEM_RETURN_IF_ERROR(WriteGptq(prefix, m, q.bits, out));
          break;
        case Format::kAwq:
          TANDEM_RETURN_IF_ERROR(WriteAwq(prefix, m, out));
          break;
        case Format::kCompressedTensors:
          WriteCompressedTensors(prefix, m, q.bits, q.symmetric, out);
          break;
      }
    }
  }
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(out_dir, ": ", ec.message()));
  for (const auto& entry : fs::directory_iterator(in_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || absl::EndsWith(name, ".safetensors") ||
        name == "model.safetensors.index.json" || name == "config.json") {
      continue;
    }
    fs::copy_file(entry.path(), fs::path(out_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat(out_dir, "/", name, ": ", ec.message()));
  }
  // A previous checkpoint's shards would be read beside the new file.
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::EndsWith(name, ".safetensors") || name == "model.safetensors.index.json") {
      fs::remove(entry.path(), ec);
    }
  }
  TANDEM_RETURN_IF_ERROR(WriteSafetensorsFile(out_dir + "/model.safetensors", out));
  config["quantization_config"] = QuantizationConfigJson(q);
  if (q.lm_head) config["tie_word_embeddings"] = false;
  return WriteStringToFile(out_dir + "/config.json", config.dump(2) + "\n");
}

}  // namespace tandem::model
