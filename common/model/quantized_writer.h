// Writes a float model directory as a quantized checkpoint in one of the formats Hugging Face
// tools publish (GPTQ, AWQ, compressed-tensors), so that other software can load what Tandem
// quantizes and tests can make checkpoints of every format from a random model.
//
// The decoder layers' matrices are quantized by round-to-nearest (kernels::QuantizeRow, the
// codes and f16 scales quantize-on-load computes), without calibration: loading the written
// checkpoint computes exactly what model.weight_quantization computes on the float model.
// Embeddings and norms keep their dtype; lm_head too unless CheckpointQuantization::lm_head.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/util/thread_pool.h"

namespace tandem::model {

struct CheckpointQuantization {
  enum class Format { kGptq, kAwq, kCompressedTensors };
  Format format = Format::kGptq;
  int bits = 4;                   // GPTQ 4 or 8; AWQ 4; compressed-tensors 8 (int-quantized) or 4
  int group_size = 128;           // input columns per scale; -1: one scale per row
  bool symmetric = true;          // false: a zero point per row and group (AWQ always has them)
  bool int8_activations = false;  // compressed-tensors W8A8: activations int8 per token
  // lm_head quantized too (GPTQ lm_head: true; compressed-tensors without lm_head in ignore).
  // A tied lm_head is written as its own quantized tensors and the model untied.
  bool lm_head = false;
};

// Parses "gptq", "awq" or "compressed-tensors" into `format`; the error lists them.
absl::Status ParseCheckpointFormat(const std::string& name, CheckpointQuantization::Format& format);

// Reads the float model in `in_dir` (single file or shards) and writes `out_dir` (created): a
// single model.safetensors with the decoder linears in `q`'s format, config.json with its
// quantization_config, and every other file of in_dir (tokenizer, generation config) copied.
// InvalidArgument naming the setting for a combination the format does not define, or a
// matrix the group size does not divide.
absl::Status WriteQuantizedCheckpoint(const std::string& in_dir, const std::string& out_dir,
                                      const CheckpointQuantization& q, ThreadPool& pool);

}  // namespace tandem::model
