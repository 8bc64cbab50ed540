#include "common/model/model_weights.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/attention.h"
#include "common/kernels/cpu/gemm.h"
#include "common/kernels/cpu/int8_tiles.h"
#include "common/kernels/cpu/onednn_gemm.h"
#include "common/util/file_util.h"
#include "common/util/json_fields.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace tandem::model {

// Looks tensors up by name across all files, checks them, and records which were used.
class WeightBinder {
 public:
  WeightBinder(ModelWeights& w, std::string dir, ThreadPool& pool)
      : w_(w), dir_(std::move(dir)), pool_(pool) {}

  absl::Status Index() {
    for (const auto& f : w_.files_) {
      for (const auto& t : f->tensors()) {
        if (!entries_.emplace(t.name, Slot{f.get(), &t}).second) {
          return absl::InvalidArgumentError(
              absl::StrCat(f->path(), ": tensor \"", t.name, "\" also appears in another shard"));
        }
      }
    }
    return absl::OkStatus();
  }

  // A matrix kept in its float dtype whose rows are read one by one (an untied embedding):
  // mapped, or packed into panels in the arena.
  absl::StatusOr<kernels::WeightMatrix> Matrix(const std::string& name, int64_t rows,
                                               int64_t cols) {
    return Load(name, rows, cols, /*quantize=*/{}, /*multiplied=*/false);
  }

  // A matrix kept in its float dtype that is multiplied (lm_head, or a tied embedding, whose
  // rows are also read): as Matrix, or packed for oneDNN when model.cpu_gemm chose it.
  absl::StatusOr<kernels::WeightMatrix> Product(const std::string& name, int64_t rows,
                                                int64_t cols) {
    return Load(name, rows, cols, /*quantize=*/{}, /*multiplied=*/true);
  }

  // A float matrix quantized at load into `format` (model.lm_head_quantization).
  absl::StatusOr<kernels::WeightMatrix> Quantize(const std::string& name, int64_t rows,
                                                 int64_t cols, const kernels::QuantFormat& format) {
    return Load(name, rows, cols, format, /*multiplied=*/true);
  }

  // A decoder layer's matrix: read from a quantized checkpoint's tensors, or quantized when the
  // options ask for it, else as Matrix. `name` ends in ".weight".
  absl::StatusOr<kernels::WeightMatrix> Linear(const std::string& name, int64_t rows,
                                               int64_t cols) {
    const std::string prefix = name.substr(0, name.size() - 7);
    if (checkpoint_ != nullptr && !Unquantized(*checkpoint_, prefix)) {
      return Quantized(prefix, rows, cols, *checkpoint_);
    }
    return Load(name, rows, cols, quantize_, /*multiplied=*/true);
  }

  void set_quantize(const kernels::QuantFormat& f) { quantize_ = f; }
  void set_onednn(bool onednn) { onednn_ = onednn; }
  // Quantized matrices whose format fits go into the arena as kInt8Tiles (AMX-INT8).
  void set_int8_tiles(bool tiles) { int8_tiles_ = tiles; }
  // How many matrices went in as kInt8Tiles.
  int int8_tiles_used() const { return int8_tiles_used_; }
  // The dtype the last float matrix bound had in its file (oneDNN may multiply it in another).
  DType stored_dtype() const { return stored_dtype_; }
  void set_checkpoint(const QuantizationConfig* q) { checkpoint_ = q; }
  bool packs() const { return packs_; }
  void set_packs(bool packs) { packs_ = packs; }

  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n) {
    TANDEM_ASSIGN_OR_RETURN(auto slot, Find(name, {n}));
    TANDEM_ASSIGN_OR_RETURN(DType dtype, FloatType(slot));
    std::vector<float> out(n);
    w_.memory_bytes += n * static_cast<int64_t>(sizeof(float));
    // memcpy-based conversion: safe for unaligned mapped bytes.
    std::vector<uint8_t> tmp(n * DTypeSize(dtype));
    std::memcpy(tmp.data(), slot.file->Data(*slot.entry), tmp.size());
    ToFloat(dtype, tmp.data(), out.data(), n);
    return out;
  }

  bool Has(const std::string& name) const { return entries_.contains(name); }
  void Ignore(const std::string& name) { used_.insert(name); }

  absl::Status CheckAllUsed() const {
    for (const auto& [name, slot] : entries_) {
      if (used_.contains(name)) continue;
      // Old Llama checkpoints carry RoPE buffers; they are recomputed, not read.
      if (absl::EndsWith(name, "rotary_emb.inv_freq")) continue;
      return absl::InvalidArgumentError(absl::StrCat(slot.file->path(), ": unexpected tensor \"",
                                                     name, "\" (not part of this architecture)"));
    }
    return absl::OkStatus();
  }

 private:
  struct Slot {
    const SafetensorsFile* file;
    const TensorEntry* entry;
  };

  absl::StatusOr<kernels::WeightMatrix> Load(const std::string& name, int64_t rows, int64_t cols,
                                             const kernels::QuantFormat& quantize,
                                             bool multiplied) {
    TANDEM_ASSIGN_OR_RETURN(auto slot, Find(name, {rows, cols}));
    TANDEM_ASSIGN_OR_RETURN(DType dtype, FloatType(slot));
    stored_dtype_ = dtype;
    TANDEM_ASSIGN_OR_RETURN(const void* data, Aligned(slot, dtype));
    const kernels::WeightMatrix stored{data, dtype, rows, cols};
    const bool realigned = !w_.realigned_.empty() && w_.realigned_.back().get() == data;
    int64_t bytes = rows * cols * static_cast<int64_t>(DTypeSize(dtype));
    kernels::WeightMatrix out = stored;
    if (quantize.bits != 0) {
      if (absl::Status format = kernels::CheckQuantFormat(quantize, cols); !format.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.weight_quantization: cannot quantize \"", name, "\": ", format.message()));
      }
      const bool tiles = Int8Tiles(quantize, cols, /*order=*/nullptr);
      bytes = tiles ? kernels::Int8TilesBytes(rows, cols)
                    : kernels::QuantPanelBytes(quantize, rows, cols);
      TANDEM_ASSIGN_OR_RETURN(uint8_t * packed, w_.arena_->Allocate(bytes));
      out = tiles ? kernels::PackInt8Tiles(quantize, dtype, rows, cols,
                                           kernels::QuantizedRows(stored, quantize), packed, pool_)
                  : kernels::QuantizeToPanels(stored, quantize, packed, pool_);
    } else if (onednn_ && multiplied) {
      auto onednn_bytes = kernels::OnednnBytes(dtype, rows, cols);
      if (!onednn_bytes.ok()) return Named(name, onednn_bytes.status());
      bytes = *onednn_bytes;
      TANDEM_ASSIGN_OR_RETURN(uint8_t * packed, w_.arena_->Allocate(bytes));
      auto onednn = kernels::PackOnednn(stored, packed, pool_);
      if (!onednn.ok()) return Named(name, onednn.status());
      out = onednn->view;
      if (w_.cpu_gemm_implementation.empty()) {
        w_.cpu_gemm_implementation =
            absl::StrCat(kernels::OnednnImplementation(out),
                         w_.bf16_attention ? ", attention on AMX bf16 tiles" : "");
      }
      w_.onednn_.push_back(std::move(onednn->owner));
    } else if (packs_) {
      bytes = kernels::PanelBytes(dtype, rows, cols);
      TANDEM_ASSIGN_OR_RETURN(uint8_t * packed, w_.arena_->Allocate(bytes));
      out = kernels::PackPanels(stored, packed, pool_);
    }
    if (out.data != data && realigned) w_.realigned_.pop_back();
    w_.memory_bytes += bytes;
    return out;
  }

  // A quantized checkpoint's linear layer as its format stores it, unpacked to what the panels
  // need: codes in the checkpoint's column order, and each group's scale and zero.
  struct StoredQuant {
    int bits = 0;
    int64_t group = 0;  // input columns per group (cols: one group per row)
    DType scale_dtype = DType::kF16;
    std::vector<float> scales;   // [groups][rows]
    std::vector<uint8_t> zeros;  // [groups][rows], as codes
    std::vector<int32_t> g_idx;  // the group of each input column; empty: k / group
    std::function<void(int64_t row, uint8_t* codes)> codes;  // one row, [cols]
  };

  // A decoder layer's linear from a quantized checkpoint; `prefix` is its module name.
  absl::StatusOr<kernels::WeightMatrix> Quantized(const std::string& prefix, int64_t rows,
                                                  int64_t cols, const QuantizationConfig& q) {
    StoredQuant stored;
    switch (q.packing) {
      case QuantizationConfig::Packing::kGptq:
        TANDEM_RETURN_IF_ERROR(Gptq(prefix, rows, cols, q, stored));
        break;
      case QuantizationConfig::Packing::kAwqGemm:
        TANDEM_RETURN_IF_ERROR(Awq(prefix, rows, cols, q, stored));
        break;
      case QuantizationConfig::Packing::kCtInt:
      case QuantizationConfig::Packing::kCtPacked:
        TANDEM_RETURN_IF_ERROR(CompressedTensors(prefix, rows, cols, q, stored));
        break;
      case QuantizationConfig::Packing::kNone:
        return absl::InternalError("quantized checkpoint without a packing");
    }
    return PackStored(prefix, rows, cols, q, stored);
  }

  // `s` with the tensor it concerns.
  static absl::Status Named(const std::string& name, const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("\"", name, "\": ", s.message()));
  }

  // The error for a quantized layer `prefix` of the checkpoint.
  absl::Status Refuse(const QuantizationConfig& q, const std::string& prefix,
                      const std::string& why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(dir_, ": ", q.Name(), " layer \"", prefix, "\": ", why));
  }

  // A tensor of integers (I8 or I32, as `dtype` says the format stores it) and shape.
  absl::StatusOr<Slot> Integers(const QuantizationConfig& q, const std::string& prefix,
                                const std::string& name, const std::vector<int64_t>& shape,
                                StDType dtype) {
    TANDEM_ASSIGN_OR_RETURN(Slot s, Find(name, shape));
    if (s.entry->dtype != dtype) {
      return Refuse(
          q, prefix,
          absl::StrCat("tensor \"", name, "\" has dtype ", std::string(StDTypeName(s.entry->dtype)),
                       ", the format stores ", std::string(StDTypeName(dtype))));
    }
    return s;
  }

  static uint32_t Word(const Slot& s, int64_t i) {
    uint32_t v;
    std::memcpy(&v, s.file->Data(*s.entry) + i * 4, 4);
    return v;
  }
  static int8_t Byte(const Slot& s, int64_t i) {
    return static_cast<int8_t>(s.file->Data(*s.entry)[i]);
  }

  // Converts a float tensor to f32 in `out`, returning its dtype.
  absl::StatusOr<DType> Floats(const Slot& s, std::vector<float>& out) {
    TANDEM_ASSIGN_OR_RETURN(DType dtype, FloatType(s));
    const int64_t n = static_cast<int64_t>(s.entry->end - s.entry->begin) / DTypeSize(dtype);
    out.resize(n);
    std::vector<uint8_t> raw(n * DTypeSize(dtype));
    std::memcpy(raw.data(), s.file->Data(*s.entry), raw.size());
    ToFloat(dtype, raw.data(), out.data(), n);
    return dtype;
  }

  // The group size a layer of `cols` inputs has, checked to divide it.
  absl::StatusOr<int64_t> GroupOf(const QuantizationConfig& q, const std::string& prefix,
                                  int64_t cols) const {
    const int64_t group = q.group_size > 0 ? q.group_size : cols;
    if (cols % group != 0) {
      return Refuse(q, prefix,
                    absl::StrCat("quantization_config group size ", group,
                                 " does not divide its input dimension ", cols));
    }
    return group;
  }

  // An act-order layer's g_idx [cols] (I32): the group of each input column.
  absl::Status GroupIndex(const QuantizationConfig& q, const std::string& prefix,
                          const std::string& name, int64_t cols, StoredQuant& out) {
    TANDEM_ASSIGN_OR_RETURN(Slot s, Integers(q, prefix, name, {cols}, StDType::kI32));
    out.g_idx.resize(cols);
    for (int64_t k = 0; k < cols; ++k) out.g_idx[k] = static_cast<int32_t>(Word(s, k));
    return absl::OkStatus();
  }

  // GPTQ (prefix.qweight, .qzeros, .scales, .g_idx), as the format packs it: qweight int32
  // [cols / pf, rows] holds input k of output n at bits (k % pf) * bits of qweight[k / pf][n]
  // (pf = 32 / bits); qzeros int32 [groups, rows / pf] holds output n's zero at bits (n % pf) *
  // bits of qzeros[g][n / pf], minus one (mod 2^bits) unless the checkpoint is gptq_v2; scales
  // [groups, rows]; g_idx [cols] the group of each input (act-order: any order).
  absl::Status Gptq(const std::string& prefix, int64_t rows, int64_t cols,
                    const QuantizationConfig& q, StoredQuant& out) {
    const int bits = q.bits, pf = 32 / bits;
    const uint32_t mask = (1u << bits) - 1;
    if (cols % pf != 0 || rows % pf != 0) {
      return Refuse(q, prefix,
                    absl::StrCat("its shape [", rows, ", ", cols, "] is not a multiple of ", pf,
                                 " in both dimensions, as ", bits, "-bit GPTQ packing needs"));
    }
    TANDEM_ASSIGN_OR_RETURN(const int64_t group, GroupOf(q, prefix, cols));
    const int64_t groups = cols / group;
    TANDEM_ASSIGN_OR_RETURN(
        Slot qweight, Integers(q, prefix, prefix + ".qweight", {cols / pf, rows}, StDType::kI32));
    TANDEM_ASSIGN_OR_RETURN(
        Slot qzeros, Integers(q, prefix, prefix + ".qzeros", {groups, rows / pf}, StDType::kI32));
    TANDEM_ASSIGN_OR_RETURN(Slot scales, Find(prefix + ".scales", {groups, rows}));
    TANDEM_ASSIGN_OR_RETURN(out.scale_dtype, Floats(scales, out.scales));
    if (Has(prefix + ".g_idx")) {
      TANDEM_RETURN_IF_ERROR(GroupIndex(q, prefix, prefix + ".g_idx", cols, out));
    }
    out.bits = bits;
    out.group = group;
    out.zeros.resize(groups * rows);
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t n = 0; n < rows; ++n) {
        // v1 stores zero - 1 in `bits` bits, so a zero of 0 wraps to all ones and back (as
        // AutoGPTQ's own dequantization masks zeros + 1).
        const uint32_t stored = (Word(qzeros, g * (rows / pf) + n / pf) >> (n % pf * bits)) & mask;
        out.zeros[g * rows + n] = static_cast<uint8_t>((stored + (q.gptq_v2 ? 0 : 1)) & mask);
      }
    }
    out.codes = [qweight, rows, cols, pf, bits, mask](int64_t n, uint8_t* codes) {
      for (int64_t k = 0; k < cols; ++k) {
        codes[k] =
            static_cast<uint8_t>((Word(qweight, k / pf * rows + n) >> (k % pf * bits)) & mask);
      }
    };
    return absl::OkStatus();
  }

  // AWQ, GEMM packing (prefix.qweight, .qzeros, .scales): qweight int32 [cols, rows / 8] holds
  // output n of input k in nibble i of qweight[k][n / 8], where n % 8 is {0, 2, 4, 6, 1, 3, 5,
  // 7}[i]; qzeros int32 [groups, rows / 8] packs the zeros the same way (stored as they are);
  // scales [groups, rows].
  absl::Status Awq(const std::string& prefix, int64_t rows, int64_t cols,
                   const QuantizationConfig& q, StoredQuant& out) {
    // Nibble of output n % 8 (the inverse of the packing order).
    static constexpr int kNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    if (rows % 8 != 0) {
      return Refuse(q, prefix,
                    absl::StrCat("its output dimension ", rows,
                                 " is not a multiple of 8, as AWQ's packing needs"));
    }
    TANDEM_ASSIGN_OR_RETURN(const int64_t group, GroupOf(q, prefix, cols));
    const int64_t groups = cols / group, words = rows / 8;
    TANDEM_ASSIGN_OR_RETURN(Slot qweight,
                            Integers(q, prefix, prefix + ".qweight", {cols, words}, StDType::kI32));
    TANDEM_ASSIGN_OR_RETURN(
        Slot qzeros, Integers(q, prefix, prefix + ".qzeros", {groups, words}, StDType::kI32));
    TANDEM_ASSIGN_OR_RETURN(Slot scales, Find(prefix + ".scales", {groups, rows}));
    TANDEM_ASSIGN_OR_RETURN(out.scale_dtype, Floats(scales, out.scales));
    out.bits = 4;
    out.group = group;
    out.zeros.resize(groups * rows);
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t n = 0; n < rows; ++n) {
        out.zeros[g * rows + n] =
            static_cast<uint8_t>((Word(qzeros, g * words + n / 8) >> (4 * kNibble[n % 8])) & 15);
      }
    }
    out.codes = [qweight, cols, words](int64_t n, uint8_t* codes) {
      const int shift = 4 * kNibble[n % 8];
      for (int64_t k = 0; k < cols; ++k) {
        codes[k] = static_cast<uint8_t>((Word(qweight, k * words + n / 8) >> shift) & 15);
      }
    };
    return absl::OkStatus();
  }

  // compressed-tensors: int-quantized / naive-quantized keep prefix.weight as int8 [rows,
  // cols]; pack-quantized packs prefix.weight_packed int32 [rows, ceil(cols / pf)], input k in
  // bits (k % pf) * bits of word k / pf, each value stored plus 2^(bits - 1), with
  // prefix.weight_shape [2] the unpacked shape. weight_scale [rows, groups] (channel: [rows,
  // 1]); weight_zero_point int8 [rows, groups] when asymmetric; weight_g_idx [cols] with
  // actorder.
  absl::Status CompressedTensors(const std::string& prefix, int64_t rows, int64_t cols,
                                 const QuantizationConfig& q, StoredQuant& out) {
    const bool packed = q.packing == QuantizationConfig::Packing::kCtPacked;
    const int bits = q.bits;
    const int64_t offset = int64_t{1} << (bits - 1);
    if (packed && !q.symmetric) {
      return Refuse(q, prefix,
                    "asymmetric pack-quantized weights (packed zero points) are planned");
    }
    TANDEM_ASSIGN_OR_RETURN(const int64_t group, GroupOf(q, prefix, cols));
    const int64_t groups = cols / group;
    TANDEM_ASSIGN_OR_RETURN(Slot scales, Find(prefix + ".weight_scale", {rows, groups}));
    std::vector<float> by_row;
    TANDEM_ASSIGN_OR_RETURN(out.scale_dtype, Floats(scales, by_row));
    out.bits = bits;
    out.group = group;
    out.scales.resize(groups * rows);
    out.zeros.assign(groups * rows, static_cast<uint8_t>(offset));
    for (int64_t n = 0; n < rows; ++n) {
      for (int64_t g = 0; g < groups; ++g) out.scales[g * rows + n] = by_row[n * groups + g];
    }
    if (!q.symmetric) {
      TANDEM_ASSIGN_OR_RETURN(Slot zp, Integers(q, prefix, prefix + ".weight_zero_point",
                                                {rows, groups}, StDType::kI8));
      for (int64_t n = 0; n < rows; ++n) {
        for (int64_t g = 0; g < groups; ++g) {
          out.zeros[g * rows + n] = static_cast<uint8_t>(Byte(zp, n * groups + g) + offset);
        }
      }
    }
    if (Has(prefix + ".weight_g_idx")) {
      TANDEM_RETURN_IF_ERROR(GroupIndex(q, prefix, prefix + ".weight_g_idx", cols, out));
    }
    if (!packed) {
      TANDEM_ASSIGN_OR_RETURN(Slot weight,
                              Integers(q, prefix, prefix + ".weight", {rows, cols}, StDType::kI8));
      out.codes = [weight, cols, offset](int64_t n, uint8_t* codes) {
        for (int64_t k = 0; k < cols; ++k) {
          codes[k] = static_cast<uint8_t>(Byte(weight, n * cols + k) + offset);
        }
      };
      return absl::OkStatus();
    }
    const int pf = 32 / bits;
    const int64_t words = (cols + pf - 1) / pf;
    const uint32_t mask = (1u << bits) - 1;
    TANDEM_ASSIGN_OR_RETURN(
        Slot weight, Integers(q, prefix, prefix + ".weight_packed", {rows, words}, StDType::kI32));
    const std::string shape_name = prefix + ".weight_shape";
    TANDEM_ASSIGN_OR_RETURN(Slot shape, Find(shape_name, {2}));
    std::vector<int64_t> dims;
    for (int i = 0; i < 2; ++i) {
      if (shape.entry->dtype == StDType::kI64) {
        int64_t v;
        std::memcpy(&v, shape.file->Data(*shape.entry) + 8 * i, 8);
        dims.push_back(v);
      } else if (shape.entry->dtype == StDType::kI32) {
        dims.push_back(static_cast<int32_t>(Word(shape, i)));
      }
    }
    if (dims != std::vector<int64_t>{rows, cols}) {
      return Refuse(q, prefix,
                    absl::StrCat("tensor \"", shape_name, "\" must be an I64 or I32 [", rows, ", ",
                                 cols, "], as config.json implies"));
    }
    out.codes = [weight, cols, words, pf, bits, mask](int64_t n, uint8_t* codes) {
      for (int64_t k = 0; k < cols; ++k) {
        codes[k] =
            static_cast<uint8_t>((Word(weight, n * words + k / pf) >> (k % pf * bits)) & mask);
      }
    };
    return absl::OkStatus();
  }

  // Packs a layer read by one of the formats above into panels, its columns sorted by group
  // when the checkpoint is act-order.
  absl::StatusOr<kernels::WeightMatrix> PackStored(const std::string& prefix, int64_t rows,
                                                   int64_t cols, const QuantizationConfig& q,
                                                   const StoredQuant& stored) {
    const int64_t groups = cols / stored.group;
    const uint8_t middle = static_cast<uint8_t>(1u << (stored.bits - 1));
    const bool has_zero = std::any_of(stored.zeros.begin(), stored.zeros.end(),
                                      [&](uint8_t z) { return z != middle; });
    const kernels::QuantFormat f{
        .bits = stored.bits,
        .group_size = stored.group == cols ? -1 : static_cast<int>(stored.group),
        .has_zero = has_zero,
        // W8A8 rounds per token; model.activation_quantization in blocks.
        .int8_activations = q.int8_activations || quantize_.int8_activations,
        .activation_block = q.int8_activations ? 0 : quantize_.activation_block};
    if (absl::Status s = kernels::CheckQuantFormat(f, cols); !s.ok()) {
      return Refuse(q, prefix, std::string(s.message()));
    }
    TANDEM_ASSIGN_OR_RETURN(const int32_t* order, InputOrder(q, prefix, stored, cols));
    const bool tiles = Int8Tiles(f, cols, order);
    const int64_t bytes =
        tiles ? kernels::Int8TilesBytes(rows, cols) : kernels::QuantPanelBytes(f, rows, cols);
    TANDEM_ASSIGN_OR_RETURN(uint8_t * packed, w_.arena_->Allocate(bytes));
    w_.memory_bytes += bytes;
    const auto pack = tiles ? &kernels::PackInt8Tiles : &kernels::PackQuantPanels;
    kernels::WeightMatrix m = pack(
        f, stored.scale_dtype, rows, cols,
        [&](int64_t n, uint8_t* codes, float* row_scales, uint8_t* row_zeros) {
          if (order == nullptr) {
            stored.codes(n, codes);
          } else {
            thread_local std::vector<uint8_t> in_order;
            in_order.resize(cols);
            stored.codes(n, in_order.data());
            for (int64_t j = 0; j < cols; ++j) codes[j] = in_order[order[j]];
          }
          for (int64_t g = 0; g < groups; ++g) {
            row_scales[g] = stored.scales[g * rows + n];
            row_zeros[g] = stored.zeros[g * rows + n];
          }
        },
        packed, pool_);
    m.input_order = order;
    return m;
  }

  // Null when every input column k is in group k / group; else the columns sorted by group
  // (stable), shared by every matrix with the same order so that products over one input
  // still share its packing. Every group must hold `group` columns.
  absl::StatusOr<const int32_t*> InputOrder(const QuantizationConfig& q, const std::string& prefix,
                                            const StoredQuant& stored, int64_t cols) {
    if (stored.g_idx.empty()) return nullptr;
    const int64_t groups = cols / stored.group;
    std::vector<int64_t> count(groups);
    bool identity = true;
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t g = stored.g_idx[k];
      if (g < 0 || g >= groups) {
        return Refuse(q, prefix,
                      absl::StrCat("g_idx[", k, "] is ", g, ", outside [0, ", groups, ")"));
      }
      if (++count[g] > stored.group) {
        return Refuse(
            q, prefix,
            absl::StrCat("g_idx puts more than ", stored.group, " input columns in group ", g));
      }
      identity &= g == k / stored.group;
    }
    if (identity) return nullptr;
    std::vector<int32_t> order(cols);
    for (int64_t k = 0; k < cols; ++k) order[k] = static_cast<int32_t>(k);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return stored.g_idx[a] < stored.g_idx[b]; });
    auto [it, inserted] = orders_.emplace(std::move(order), nullptr);
    if (inserted) {
      TANDEM_ASSIGN_OR_RETURN(uint8_t * bytes, w_.arena_->Allocate(cols * sizeof(int32_t)));
      std::memcpy(bytes, it->first.data(), cols * sizeof(int32_t));
      w_.memory_bytes += cols * static_cast<int64_t>(sizeof(int32_t));
      it->second = reinterpret_cast<const int32_t*>(bytes);
    }
    return it->second;
  }

  // True when the checkpoint leaves module `prefix` in its float dtype: AWQ's
  // modules_to_not_convert (a name anywhere in the module's), compressed-tensors' ignore (the
  // module's name, or "re:" and a regular expression it matches).
  bool Unquantized(const QuantizationConfig& q, const std::string& prefix) const {
    for (const std::string& entry : q.ignore) {
      if (q.method == QuantizationConfig::Method::kAwq) {
        if (prefix.find(entry) != std::string::npos) return true;
      } else if (absl::StartsWith(entry, "re:")) {
        if (std::regex_match(prefix, std::regex(entry.substr(3)))) return true;
      } else if (entry == prefix) {
        return true;
      }
    }
    return false;
  }

  absl::StatusOr<Slot> Find(const std::string& name, const std::vector<int64_t>& shape) {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir_, ": missing tensor \"", name, "\" in the safetensors files"));
    }
    const Slot& s = it->second;
    if (s.entry->shape != shape) {
      auto dims = [](const std::vector<int64_t>& v) {
        std::string out = "[";
        for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&out, i ? ", " : "", v[i]);
        return out + "]";
      };
      return absl::InvalidArgumentError(absl::StrCat(s.file->path(), ": tensor \"", name,
                                                     "\" has shape ", dims(s.entry->shape),
                                                     ", config.json implies ", dims(shape)));
    }
    // (A tied head quantized at load reads the embedding twice: its bytes count once.)
    if (used_.insert(name).second) {
      w_.total_bytes += static_cast<int64_t>(s.entry->end - s.entry->begin);
    }
    return s;
  }

  absl::StatusOr<DType> FloatType(const Slot& s) {
    switch (s.entry->dtype) {
      case StDType::kF32:
        return DType::kF32;
      case StDType::kF16:
        return DType::kF16;
      case StDType::kBF16:
        return DType::kBF16;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            s.file->path(), ": tensor \"", s.entry->name, "\" has dtype ",
            std::string(StDTypeName(s.entry->dtype)), "; weights must be F32, F16 or BF16"));
    }
  }

  // The tensor's bytes aligned to their element size: the mapping itself, or a copy when the
  // file leaves them misaligned.
  absl::StatusOr<const void*> Aligned(const Slot& s, DType dtype) {
    const uint8_t* p = s.file->Data(*s.entry);
    size_t n = s.entry->end - s.entry->begin;
    if (reinterpret_cast<uintptr_t>(p) % DTypeSize(dtype) == 0) return p;
    auto copy = std::make_unique<uint8_t[]>(n);
    std::memcpy(copy.get(), p, n);
    w_.realigned_.push_back(std::move(copy));
    return w_.realigned_.back().get();
  }

  // Whether a quantized matrix of `format` over `cols` columns (its columns gathered through
  // `order`) goes in as kInt8Tiles; counts it.
  bool Int8Tiles(const kernels::QuantFormat& format, int64_t cols, const int32_t* order) {
    const bool tiles = int8_tiles_ && order == nullptr && kernels::Int8TilesFit(format, cols);
    int8_tiles_used_ += tiles ? 1 : 0;
    return tiles;
  }

  ModelWeights& w_;
  std::string dir_;
  ThreadPool& pool_;
  kernels::QuantFormat quantize_{};
  const QuantizationConfig* checkpoint_ = nullptr;  // a quantized checkpoint's settings
  bool packs_ = false;                              // float matrices go into the arena as panels
  bool onednn_ = false;  // multiplied-only float matrices go into the arena packed for oneDNN
  bool int8_tiles_ = false;
  int int8_tiles_used_ = 0;
  DType stored_dtype_ = DType::kBF16;
  absl::flat_hash_map<std::string, Slot> entries_;
  std::map<std::vector<int32_t>, const int32_t*> orders_;  // act-order permutations, shared
  std::set<std::string> used_;
};

absl::StatusOr<std::vector<std::string>> ListWeightFiles(const std::string& dir) {
  std::string index_path = dir + "/model.safetensors.index.json";
  if (!FileExists(index_path)) {
    std::string single = dir + "/model.safetensors";
    if (!FileExists(single)) {
      return absl::NotFoundError(absl::StrCat(
          dir, ": no model.safetensors or model.safetensors.index.json in the model directory"));
    }
    return std::vector<std::string>{single};
  }
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path, 64 << 20));
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject(text, index_path));
  auto map = j.find("weight_map");
  if (map == j.end() || !map->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": key \"weight_map\" must be an object"));
  }
  std::set<std::string> files;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string() || it->get<std::string>().find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map entry \"", it.key(),
                                                     "\" must name a file in the directory"));
    }
    files.insert(it->get<std::string>());
  }
  std::vector<std::string> out;
  for (const auto& f : files) out.push_back(dir + "/" + f);
  return out;
}

namespace {

absl::Status BindLayer(WeightBinder& b, const ModelConfig& c, int i, LayerWeights& l) {
  std::string p = absl::StrCat("model.layers.", i, ".");
  int64_t h = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim,
          kv = int64_t{c.num_kv_heads} * c.head_dim, f = c.intermediate_size;
  TANDEM_ASSIGN_OR_RETURN(l.input_norm, b.Vector(p + "input_layernorm.weight", h));
  TANDEM_ASSIGN_OR_RETURN(l.q_proj, b.Linear(p + "self_attn.q_proj.weight", q, h));
  TANDEM_ASSIGN_OR_RETURN(l.k_proj, b.Linear(p + "self_attn.k_proj.weight", kv, h));
  TANDEM_ASSIGN_OR_RETURN(l.v_proj, b.Linear(p + "self_attn.v_proj.weight", kv, h));
  TANDEM_ASSIGN_OR_RETURN(l.o_proj, b.Linear(p + "self_attn.o_proj.weight", h, q));
  if (c.attention_bias) {
    TANDEM_ASSIGN_OR_RETURN(l.q_bias, b.Vector(p + "self_attn.q_proj.bias", q));
    TANDEM_ASSIGN_OR_RETURN(l.k_bias, b.Vector(p + "self_attn.k_proj.bias", kv));
    TANDEM_ASSIGN_OR_RETURN(l.v_bias, b.Vector(p + "self_attn.v_proj.bias", kv));
  }
  if (c.qk_norm) {
    TANDEM_ASSIGN_OR_RETURN(l.q_norm, b.Vector(p + "self_attn.q_norm.weight", c.head_dim));
    TANDEM_ASSIGN_OR_RETURN(l.k_norm, b.Vector(p + "self_attn.k_norm.weight", c.head_dim));
  }
  TANDEM_ASSIGN_OR_RETURN(l.post_attention_norm,
                          b.Vector(p + "post_attention_layernorm.weight", h));
  TANDEM_ASSIGN_OR_RETURN(l.gate_proj, b.Linear(p + "mlp.gate_proj.weight", f, h));
  TANDEM_ASSIGN_OR_RETURN(l.up_proj, b.Linear(p + "mlp.up_proj.weight", f, h));
  TANDEM_ASSIGN_OR_RETURN(l.down_proj, b.Linear(p + "mlp.down_proj.weight", h, f));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WeightMemory> ParseWeightMemory(std::string_view name) {
  if (name == "mmap") return WeightMemory::kMmap;
  if (name == "hugepages") return WeightMemory::kHugePages;
  return absl::InvalidArgumentError(
      absl::StrCat("weight memory must be mmap or hugepages, got \"", std::string(name), "\""));
}

absl::StatusOr<kernels::QuantFormat> ParseWeightQuantization(std::string_view name, int group_size,
                                                             std::string_view activations) {
  kernels::QuantFormat f;
  if (activations == "int8") {
    f.int8_activations = true;
    f.activation_block = kActivationBlock;
  } else if (activations == "int8-token") {
    f.int8_activations = true;
    f.activation_block = 0;
  } else if (activations != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.activation_quantization must be none, int8 or int8-token, got \"",
                     std::string(activations), "\""));
  }
  if (name == "none") return f;
  if (name == "int8") {
    f.bits = 8;
  } else if (name == "int4") {
    f.bits = 4;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.weight_quantization must be none, int8 or int4, got \"", std::string(name), "\""));
  }
  f.group_size = group_size != 0 ? group_size : f.bits == 8 ? -1 : 128;
  if (f.group_size != -1 && (f.group_size < 16 || 256 % f.group_size != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.weight_quantization_group_size must be -1 (one group per row), 16, "
                     "32, 64, 128 or 256, got ",
                     group_size));
  }
  return f;
}

absl::StatusOr<kernels::QuantFormat> ParseLmHeadQuantization(std::string_view name,
                                                             const kernels::QuantFormat& layers) {
  if (name == "none") return kernels::QuantFormat{};
  if (name != "int8") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.lm_head_quantization must be none or int8, got \"", std::string(name), "\""));
  }
  return kernels::QuantFormat{.bits = 8,
                              .group_size = -1,
                              .int8_activations = layers.int8_activations,
                              .activation_block = layers.activation_block};
}

absl::Status QuantizationFromFlags(const CliArgs& args, WeightLoadOptions& load) {
  TANDEM_ASSIGN_OR_RETURN(int64_t group, args.IntOr("weight-quantization-group-size", 0));
  TANDEM_ASSIGN_OR_RETURN(
      load.quantize,
      ParseWeightQuantization(args.StringOr("weight-quantization", "none"),
                              static_cast<int>(std::clamp<int64_t>(group, -2, 1 << 20)),
                              args.StringOr("activation-quantization", "none")));
  TANDEM_ASSIGN_OR_RETURN(
      load.lm_head_quantize,
      ParseLmHeadQuantization(args.StringOr("lm-head-quantization", "none"), load.quantize));
  return absl::OkStatus();
}

std::set<std::string> WithQuantizationFlags(std::set<std::string> known) {
  known.insert({"weight-quantization", "weight-quantization-group-size", "activation-quantization",
                "lm-head-quantization"});
  return known;
}

std::string WeightFormatName(DType dtype, const kernels::QuantFormat& quant) {
  return quant.bits == 0 ? std::string(DTypeName(dtype)) : QuantizationName(quant);
}

std::string QuantizationName(const kernels::QuantFormat& quant) {
  if (quant.bits == 0) return "";
  std::string name = absl::StrCat("int", quant.bits);
  if (quant.group_size > 0) absl::StrAppend(&name, "-g", quant.group_size);
  if (quant.has_zero) absl::StrAppend(&name, "-zp");
  if (quant.int8_activations) absl::StrAppend(&name, quant.activation_block == 0 ? "-a8t" : "-a8");
  return name;
}

std::string LoadedQuantizationName(const QuantizationConfig& checkpoint,
                                   const kernels::QuantFormat& quantize,
                                   const kernels::QuantFormat& lm_head) {
  std::string name = QuantizationName(quantize);
  if (checkpoint.quantized()) {
    const bool a8 = quantize.int8_activations && !checkpoint.int8_activations;
    name = absl::StrCat(checkpoint.Name(), !a8                             ? ""
                                           : quantize.activation_block == 0 ? "-a8t"
                                                                            : "-a8");
  }
  if (lm_head.bits == 0) return name;
  return absl::StrCat(name, name.empty() ? "" : "+", "lm_head-", QuantizationName(lm_head));
}

namespace {

// model.cpu_gemm for this model: oneDNN multiplies float weights on the CPU only.
absl::StatusOr<kernels::CpuGemmChoice> ChooseGemm(const ModelConfig& c,
                                                  const WeightLoadOptions& options) {
  const bool quantized = options.quantize.bits != 0 || options.lm_head_quantize.bits != 0 ||
                         c.quantization.quantized();
  const bool cpu = options.device.kind == kernels::DeviceSpec::Kind::kCpu;
  if (options.cpu_gemm == kernels::CpuGemm::kOnednn && (quantized || !cpu)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.cpu_gemm: onednn multiplies float weights on the CPU backend; this model's are ",
        quantized ? "quantized" : absl::StrCat("on ", options.device.ToString()),
        " (leave model.cpu_gemm at auto or tandem)"));
  }
  if (quantized || !cpu) {
    return kernels::CpuGemmChoice{kernels::CpuGemm::kTandem, quantized
                                                                 ? "tandem (quantized weights)"
                                                                 : "tandem (not on the CPU)"};
  }
  return kernels::ChooseCpuGemm(options.cpu_gemm, c.torch_dtype);
}

}  // namespace

absl::StatusOr<uint64_t> WeightsFingerprint(const std::string& dir) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> paths, ListWeightFiles(dir));
  uint64_t fingerprint = 0;
  for (const auto& path : paths) {
    TANDEM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    fingerprint = file->Fingerprint(fingerprint);
  }
  return fingerprint;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(const std::string& dir,
                                                                 const ModelConfig& c,
                                                                 const WeightLoadOptions& options) {
  const QuantizationConfig& q = c.quantization;
  const bool quantize_head = options.lm_head_quantize.bits != 0;
  if (quantize_head && q.quantized() && q.lm_head) {
    return absl::InvalidArgumentError(absl::StrCat("model.lm_head_quantization: ", dir,
                                                   " quantizes lm_head already (", q.Name(),
                                                   "); leave model.lm_head_quantization at none"));
  }
  if (q.quantized()) {
    if (options.quantize.bits != 0) {
      return absl::InvalidArgumentError(absl::StrCat("model.weight_quantization: ", dir,
                                                     " is already quantized (", q.Name(),
                                                     "); leave model.weight_quantization at none"));
    }
  } else if (options.quantize.bits == 0 && options.quantize.int8_activations && !quantize_head) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.activation_quantization: int8 rounds the input of quantized matrices, and ", dir,
        " is not quantized; set model.weight_quantization (or model.lm_head_quantization) too, "
        "or leave it at none"));
  }
  auto w = std::make_unique<ModelWeights>();
  const bool packs = options.memory == WeightMemory::kHugePages;
  TANDEM_ASSIGN_OR_RETURN(const kernels::CpuGemmChoice gemm, ChooseGemm(c, options));
  const bool onednn = gemm.gemm == kernels::CpuGemm::kOnednn;
  w->cpu_gemm = gemm.reason;
  w->gemm = gemm.gemm;
  // (oneDNN multiplies f16 weights as bf16 too; f32 weights stay f32 throughout.)
  w->bf16_attention =
      onednn && c.torch_dtype != DType::kF32 && kernels::Bf16AttentionTiles(c.head_dim);
  w->kernels = options.device.kind != kernels::DeviceSpec::Kind::kCpu ? "cuda"
               : onednn ? absl::StrCat("onednn/", kernels::OnednnCpuInfo().isa,
                                       w->bf16_attention ? "+bf16-attention" : "")
                        : "tandem";
  if (packs || onednn || options.quantize.bits != 0 || quantize_head || q.quantized()) {
    w->arena_ = std::make_unique<HugePageArena>();
  }
  w->quant = options.quantize;
  w->quantization = LoadedQuantizationName(q, options.quantize, options.lm_head_quantize);
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> paths, ListWeightFiles(dir));
  for (const auto& path : paths) {
    TANDEM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    w->fingerprint = file->Fingerprint(w->fingerprint);
    w->files_.push_back(std::move(file));
  }
  ThreadPool serial(1);
  WeightBinder b(*w, dir, options.pool != nullptr ? *options.pool : serial);
  TANDEM_RETURN_IF_ERROR(b.Index());
  b.set_packs(packs);
  b.set_onednn(onednn);
  // model.cpu_gemm auto on a CPU with AMX-INT8: the quantized matrices that fit (8 bits, one
  // scale per row, int8 activations per token) multiply on the tiles.
  b.set_int8_tiles(options.cpu_gemm == kernels::CpuGemm::kAuto &&
                   options.device.kind == kernels::DeviceSpec::Kind::kCpu);
  b.set_quantize(options.quantize);
  if (q.quantized()) b.set_checkpoint(&q);
  // A tied embedding is lm_head too: oneDNN multiplies it, and unpacks the rows it embeds.
  const bool embedding_is_head =
      c.tie_word_embeddings && !(q.quantized() && q.lm_head) && !quantize_head;
  TANDEM_ASSIGN_OR_RETURN(w->embed_tokens,
                          embedding_is_head
                              ? b.Product("model.embed_tokens.weight", c.vocab_size, c.hidden_size)
                              : b.Matrix("model.embed_tokens.weight", c.vocab_size, c.hidden_size));
  w->dtype = b.stored_dtype();  // the embedding's, as its file holds it
  w->layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    TANDEM_RETURN_IF_ERROR(BindLayer(b, c, i, w->layers[i]));
  }
  if (q.quantized()) w->quant = w->layers[0].q_proj.quant;
  TANDEM_ASSIGN_OR_RETURN(w->final_norm, b.Vector("model.norm.weight", c.hidden_size));
  if (q.quantized() && q.lm_head) {
    // GPTQ lm_head: true, or compressed-tensors not ignoring it: its own quantized tensors (a
    // checkpoint quantizing a tied head stores it untied).
    TANDEM_ASSIGN_OR_RETURN(w->lm_head, b.Linear("lm_head.weight", c.vocab_size, c.hidden_size));
  } else if (quantize_head) {
    // model.lm_head_quantization: a quantized copy of the head, tied or not.
    if (c.tie_word_embeddings) b.Ignore("lm_head.weight");
    TANDEM_ASSIGN_OR_RETURN(
        w->lm_head,
        b.Quantize(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                   c.vocab_size, c.hidden_size, options.lm_head_quantize));
  } else if (c.tie_word_embeddings) {
    // Some tied checkpoints still store lm_head; HF ties it to the embedding regardless.
    b.Ignore("lm_head.weight");
    w->lm_head = w->embed_tokens;
  } else {
    TANDEM_ASSIGN_OR_RETURN(w->lm_head, b.Product("lm_head.weight", c.vocab_size, c.hidden_size));
  }
  TANDEM_RETURN_IF_ERROR(b.CheckAllUsed());
  const bool int8_tiles = b.int8_tiles_used() > 0;
  if (int8_tiles) {
    w->cpu_gemm = "auto: AMX-INT8 tiles for the int8 matrices with per-token int8 activations";
    // Attention's products on AMX bf16 tiles too, as with oneDNN's GEMMs (a 16-bit model).
    w->bf16_attention = c.torch_dtype != DType::kF32 && kernels::Bf16AttentionTiles(c.head_dim);
    w->kernels = w->bf16_attention ? "tandem+amx-int8+bf16-attention" : "tandem+amx-int8";
  }
  if (options.device.kind == kernels::DeviceSpec::Kind::kCpu && !w->quantization.empty()) {
    // (the layers' kernels; the head's where only lm_head is quantized)
    w->cpu_gemm_implementation = kernels::QuantKernelName(w->layers[0].q_proj);
    if (w->cpu_gemm_implementation.empty()) {
      w->cpu_gemm_implementation = kernels::QuantKernelName(w->lm_head);
    }
    if (int8_tiles && w->bf16_attention) {
      absl::StrAppend(&w->cpu_gemm_implementation, ", attention on AMX bf16 tiles");
    }
  }
  if (options.cpu_gemm != kernels::CpuGemm::kTandem) {
    Log(LogLevel::kInfo, "model",
        absl::StrCat("model.cpu_gemm: ", w->cpu_gemm,
                     onednn || int8_tiles ? absl::StrCat(", ", w->cpu_gemm_implementation)
                                          : ""));
  }
  // Every matrix now lives in the arena and every vector was converted: the mappings would
  // only keep the files' pages charged to the process (twice the model in RSS).
  if (packs) w->files_.clear();
  return w;
}

}  // namespace tandem::model
