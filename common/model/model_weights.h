#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kernels/backend_factory.h"
#include "common/kernels/cpu/gemm.h"
#include "common/kernels/cpu/onednn_gemm.h"
#include "common/kernels/cpu/quant_pack.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/util/cli_args.h"
#include "common/util/huge_page_arena.h"

namespace tandem::model {

// Weights of one decoder layer. Matrices keep their stored dtype (memory-mapped, or packed into
// panels in huge pages: see WeightMemory); the small vectors (norms, biases) are converted to
// f32 once at load time.
struct LayerWeights {
  std::vector<float> input_norm;
  kernels::WeightMatrix q_proj, k_proj, v_proj, o_proj;
  std::vector<float> q_bias, k_bias, v_bias;  // empty unless config.attention_bias
  std::vector<float> q_norm, k_norm;          // [head_dim], Qwen3 only
  std::vector<float> post_attention_norm;
  kernels::WeightMatrix gate_proj, up_proj, down_proj;
};

// Where the large matrices live once loaded.
enum class WeightMemory {
  kMmap,  // zero-copy views of the memory-mapped files (shared page cache, fast start)
  // Copied into anonymous 2 MiB-page memory (fewer TLB misses), packed on the way into the
  // GEMM's panel layout (kernels::WeightLayout::kPanels): no per-call packing, faster decode
  // and prefill, and results that do not depend on the batch size.
  kHugePages,
};

struct WeightLoadOptions {
  WeightMemory memory = WeightMemory::kMmap;
  ThreadPool* pool = nullptr;  // packs kHugePages weights in parallel; null: the calling thread
  // Where the model computes (model.device). A device backend reads row-major weights, so
  // kHugePages (the CPU GEMM's panels) is for the CPU only.
  kernels::DeviceSpec device{};
  // Quantize the decoder layers' matrices at load (bits 0: keep them as stored). The matrices
  // are then kernels::WeightLayout::kQuantPanels in the arena, whatever `memory` says; the
  // embedding, the norms and lm_head keep their dtype.
  kernels::QuantFormat quantize{};
  // Quantize lm_head at load too (model.lm_head_quantization; bits 0: keep its dtype). A tied
  // embedding stays as stored for the rows it embeds, and lm_head becomes a quantized copy.
  kernels::QuantFormat lm_head_quantize{};
  // model.cpu_gemm: which GEMMs multiply the float matrices on the CPU (kAuto: as
  // kernels::ChooseCpuGemm decides; the library's default is the own kernels, the config's
  // auto). Quantized matrices and an untied embedding stay on the own kernels.
  kernels::CpuGemm cpu_gemm = kernels::CpuGemm::kTandem;
};

absl::StatusOr<WeightMemory> ParseWeightMemory(std::string_view name);

// Columns per activation scale of model.activation_quantization: int8 (llama.cpp's Q8_0 block).
inline constexpr int kActivationBlock = 32;

// model.weight_quantization and its group size as a format: "none" (bits 0), "int8" (one scale
// per output row unless group_size says otherwise) or "int4" (groups of 128 unless
// group_size). group_size: 0 for the default, -1 for one group per row, else the columns per
// group. `activations` "int8" (model.activation_quantization) sets int8_activations in blocks
// of kActivationBlock, "int8-token" with one scale per row (activation_block 0), also with bits
// 0, where it applies to a quantized checkpoint.
absl::StatusOr<kernels::QuantFormat> ParseWeightQuantization(std::string_view name, int group_size,
                                                             std::string_view activations = "none");

// model.lm_head_quantization as a format: "none" (bits 0) or "int8" (one scale per row), its
// input rounded to int8 as `layers` (ParseWeightQuantization's result) says.
absl::StatusOr<kernels::QuantFormat> ParseLmHeadQuantization(std::string_view name,
                                                             const kernels::QuantFormat& layers);

// --weight-quantization none|int8|int4, --weight-quantization-group-size G,
// --activation-quantization none|int8 and --lm-head-quantization none|int8, the tools' flags
// for the same settings, into `load`.
absl::Status QuantizationFromFlags(const CliArgs& args, WeightLoadOptions& load);

// `known` (a tool's CliArgs::CheckKnown set) with the flags QuantizationFromFlags reads.
std::set<std::string> WithQuantizationFlags(std::set<std::string> known);

// The name of a quantized format, as workers compare it at registration: "int8" (one scale per
// row), "int4-g128"; an asymmetric format adds "-zp", int8 activations "-a8". Empty when bits
// is 0.
std::string QuantizationName(const kernels::QuantFormat& quant);

// The name of the weights a model loads with `quantize` and `lm_head` (WeightLoadOptions): the
// checkpoint's format (QuantizationConfig::Name, "-a8" added for int8 activations it does not
// define itself), else QuantizationName(quantize); a quantized lm_head adds
// "+lm_head-<QuantizationName(lm_head)>" ("int4-g128+lm_head-int8", or "lm_head-int8" alone).
std::string LoadedQuantizationName(const QuantizationConfig& checkpoint,
                                   const kernels::QuantFormat& quantize,
                                   const kernels::QuantFormat& lm_head = {});

// The weights' numeric format for people: QuantizationName, or the float dtype ("bf16").
std::string WeightFormatName(DType dtype, const kernels::QuantFormat& quant);

// The safetensors files of a model directory: DIR/model.safetensors, or the shards
// DIR/model.safetensors.index.json lists.
absl::StatusOr<std::vector<std::string>> ListWeightFiles(const std::string& dir);

// The fingerprint ModelWeights::Load gives the weight files of `dir`, without loading them
// (at most 64 KiB read per tensor: SafetensorsFile::Fingerprint).
absl::StatusOr<uint64_t> WeightsFingerprint(const std::string& dir);

// All weights of a model directory, validated against its config: every expected tensor present
// with the right shape and a float dtype, no unexpected tensors. Owns the mappings.
class ModelWeights {
 public:
  // Loads DIR/model.safetensors or the shards listed in DIR/model.safetensors.index.json.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(const std::string& dir,
                                                            const ModelConfig& config,
                                                            const WeightLoadOptions& options = {});

  kernels::WeightMatrix embed_tokens;
  kernels::WeightMatrix lm_head;  // equals embed_tokens when embeddings are tied
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;
  DType dtype = DType::kBF16;  // dtype of the large matrices (the embedding's)
  kernels::QuantFormat quant{};  // of the decoder layers' matrices; bits 0: not quantized
  // The quantized format's name (QuantizationName, or QuantizationConfig::Name for a quantized
  // checkpoint such as "gptq-w4-g128-sym"); empty for float weights.
  std::string quantization;
  // model.cpu_gemm as chosen, and why ("tandem (auto: f32 weights; oneDNN ISA avx2)"); the
  // oneDNN implementation its matrices run ("brg:avx512_core_amx_bf16"), or for quantized
  // weights on the CPU the kernels that multiply them (kernels::QuantKernelName); else empty.
  // oneDNN's choice also names the attention's arithmetic where it runs on bf16 tiles
  // (bf16_attention): ", attention on AMX bf16 tiles".
  std::string cpu_gemm;
  std::string cpu_gemm_implementation;
  kernels::CpuGemm gemm = kernels::CpuGemm::kTandem;  // the provider chosen (never kAuto)
  // Attention multiplies in bf16 as the GEMMs do (kernels::AttentionMath::kBf16Tiles): oneDNN
  // chosen for 16-bit weights on a CPU with AMX, head_dim a multiple of 64.
  bool bf16_attention = false;
  // The arithmetic the products run, as workers compare it (tandem.v1.KvLayout.kernels):
  // "tandem", "onednn/<oneDNN's ISA>" or the device's kind ("cuda").
  std::string kernels;
  // Of the weight files (SafetensorsFile::Fingerprint, in order): part of every KV block's hash,
  // so KV computed with other weights under the same model id is never found.
  uint64_t fingerprint = 0;
  int64_t total_bytes = 0;       // bytes of all tensors used, as stored in the files
  int64_t memory_bytes = 0;      // bytes the loaded weights take in memory (mapped or copied)

  // The format for people: the quantization's name, or the float dtype.
  std::string format() const {
    return quantization.empty() ? std::string(DTypeName(dtype)) : quantization;
  }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  // Copies of tensors whose mapped bytes are not aligned to their element size.
  std::vector<std::unique_ptr<uint8_t[]>> realigned_;
  std::unique_ptr<HugePageArena> arena_;  // kHugePages only
  std::vector<std::shared_ptr<const void>> onednn_;  // kOnednn matrices' oneDNN state
  friend class WeightBinder;
};

}  // namespace tandem::model
