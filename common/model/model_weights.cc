#include "common/model/model_weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/util/file_util.h"
#include "common/util/json_fields.h"
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

  // A matrix kept in its float dtype: mapped, or packed into panels in the arena.
  absl::StatusOr<kernels::WeightMatrix> Matrix(const std::string& name, int64_t rows,
                                               int64_t cols) {
    return Load(name, rows, cols, /*quantize=*/{});
  }

  // A decoder layer's matrix: read from a GPTQ checkpoint's tensors, or quantized when the
  // options ask for it, else as Matrix. `name` ends in ".weight".
  absl::StatusOr<kernels::WeightMatrix> Linear(const std::string& name, int64_t rows,
                                               int64_t cols) {
    if (gptq_ != nullptr) return Gptq(name.substr(0, name.size() - 7), rows, cols, *gptq_);
    return Load(name, rows, cols, quantize_);
  }

  void set_quantize(const kernels::QuantFormat& f) { quantize_ = f; }
  void set_gptq(const QuantizationConfig* q) { gptq_ = q; }
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
                                             const kernels::QuantFormat& quantize) {
    TANDEM_ASSIGN_OR_RETURN(auto slot, Find(name, {rows, cols}));
    TANDEM_ASSIGN_OR_RETURN(DType dtype, FloatType(slot));
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
      bytes = kernels::QuantPanelBytes(quantize, rows, cols);
      TANDEM_ASSIGN_OR_RETURN(uint8_t * packed, w_.arena_->Allocate(bytes));
      out = kernels::QuantizeToPanels(stored, quantize, packed, pool_);
    } else if (packs_) {
      bytes = kernels::PanelBytes(dtype, rows, cols);
      TANDEM_ASSIGN_OR_RETURN(uint8_t * packed, w_.arena_->Allocate(bytes));
      out = kernels::PackPanels(stored, packed, pool_);
    }
    if (out.data != data && realigned) w_.realigned_.pop_back();
    w_.memory_bytes += bytes;
    return out;
  }

  // A GPTQ linear layer (prefix.qweight, .qzeros, .scales, .g_idx) of `rows` outputs and `cols`
  // inputs, as the format packs it: qweight int32 [cols / pf, rows] holds input k of output n at
  // bits (k % pf) * bits of qweight[k / pf][n] (pf = 32 / bits); qzeros int32 [groups, rows / pf]
  // holds output n's zero at bits (n % pf) * bits of qzeros[g][n / pf], minus one unless the
  // checkpoint is gptq_v2; scales [groups, rows]; g_idx [cols] the group of each input.
  absl::StatusOr<kernels::WeightMatrix> Gptq(const std::string& prefix, int64_t rows, int64_t cols,
                                             const QuantizationConfig& q) {
    const int bits = q.bits, pf = 32 / bits;
    const uint32_t mask = (1u << bits) - 1;
    const int64_t group = q.group_size > 0 ? q.group_size : cols;
    auto refuse = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(dir_, ": GPTQ layer \"", prefix, "\": ", why));
    };
    if (cols % pf != 0 || rows % pf != 0) {
      return refuse(absl::StrCat("its shape [", rows, ", ", cols, "] is not a multiple of ", pf,
                                 " in both dimensions, as ", bits, "-bit GPTQ packing needs"));
    }
    if (cols % group != 0) {
      return refuse(absl::StrCat("quantization_config.group_size ", group,
                                 " does not divide its input dimension ", cols));
    }
    const int64_t groups = cols / group;
    TANDEM_ASSIGN_OR_RETURN(auto qweight, Find(prefix + ".qweight", {cols / pf, rows}));
    TANDEM_ASSIGN_OR_RETURN(auto qzeros, Find(prefix + ".qzeros", {groups, rows / pf}));
    TANDEM_ASSIGN_OR_RETURN(auto scale_slot, Find(prefix + ".scales", {groups, rows}));
    for (const Slot* s : {&qweight, &qzeros}) {
      if (s->entry->dtype != StDType::kI32) {
        return refuse(absl::StrCat("tensor \"", s->entry->name, "\" has dtype ",
                                   std::string(StDTypeName(s->entry->dtype)), ", GPTQ packs I32"));
      }
    }
    TANDEM_ASSIGN_OR_RETURN(DType scale_dtype, FloatType(scale_slot));
    auto word = [](const Slot& s, int64_t i) {
      uint32_t v;
      std::memcpy(&v, s.file->Data(*s.entry) + i * 4, 4);
      return v;
    };
    if (Has(prefix + ".g_idx")) {
      TANDEM_ASSIGN_OR_RETURN(auto g_idx, Find(prefix + ".g_idx", {cols}));
      if (g_idx.entry->dtype != StDType::kI32) return refuse("g_idx must be I32");
      for (int64_t k = 0; k < cols; ++k) {
        if (static_cast<int64_t>(word(g_idx, k)) != k / group) {
          return refuse(absl::StrCat(
              "g_idx[", k, "] is ", static_cast<int32_t>(word(g_idx, k)), ", not ", k / group,
              ": act-order (desc_act) checkpoints, whose groups are not consecutive columns, are "
              "planned"));
        }
      }
    }
    // Zeros and scales of every group and output, unpacked once.
    std::vector<float> scales(groups * rows);
    {
      std::vector<uint8_t> raw(scales.size() * DTypeSize(scale_dtype));
      std::memcpy(raw.data(), scale_slot.file->Data(*scale_slot.entry), raw.size());
      ToFloat(scale_dtype, raw.data(), scales.data(), scales.size());
    }
    std::vector<uint8_t> zeros(groups * rows);
    bool all_middle = true;
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t n = 0; n < rows; ++n) {
        const uint32_t stored = (word(qzeros, g * (rows / pf) + n / pf) >> (n % pf * bits)) & mask;
        const uint32_t zero = stored + (q.gptq_v2 ? 0 : 1);
        if (zero > 255) {
          return refuse(absl::StrCat("output ", n, " of group ", g,
                                     " has zero 256 (GPTQ v1 stores a zero of 0 that way), "
                                     "which Tandem cannot represent"));
        }
        zeros[g * rows + n] = static_cast<uint8_t>(zero);
        all_middle &= zero == (1u << (bits - 1));
      }
    }
    const kernels::QuantFormat f{
        .bits = bits, .group_size = q.group_size > 0 ? q.group_size : -1, .has_zero = !all_middle};
    if (absl::Status s = kernels::CheckQuantFormat(f, cols); !s.ok()) {
      return refuse(std::string(s.message()));
    }
    const int64_t bytes = kernels::QuantPanelBytes(f, rows, cols);
    TANDEM_ASSIGN_OR_RETURN(uint8_t * packed, w_.arena_->Allocate(bytes));
    w_.memory_bytes += bytes;
    return kernels::PackQuantPanels(
        f, scale_dtype, rows, cols,
        [&](int64_t n, uint8_t* codes, float* row_scales, uint8_t* row_zeros) {
          for (int64_t k = 0; k < cols; ++k) {
            codes[k] =
                static_cast<uint8_t>((word(qweight, k / pf * rows + n) >> (k % pf * bits)) & mask);
          }
          for (int64_t g = 0; g < groups; ++g) {
            row_scales[g] = scales[g * rows + n];
            row_zeros[g] = zeros[g * rows + n];
          }
        },
        packed, pool_);
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
    used_.insert(name);
    w_.total_bytes += static_cast<int64_t>(s.entry->end - s.entry->begin);
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

  ModelWeights& w_;
  std::string dir_;
  ThreadPool& pool_;
  kernels::QuantFormat quantize_{};
  const QuantizationConfig* gptq_ = nullptr;  // a GPTQ checkpoint's settings
  bool packs_ = false;  // float matrices go into the arena as panels
  absl::flat_hash_map<std::string, Slot> entries_;
  std::set<std::string> used_;
};

namespace {

// Lists the safetensors files of a model directory (sharded or not).
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

absl::StatusOr<kernels::QuantFormat> ParseWeightQuantization(std::string_view name,
                                                             int group_size) {
  kernels::QuantFormat f;
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

absl::StatusOr<kernels::QuantFormat> WeightQuantizationFromFlags(const CliArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(int64_t group, args.IntOr("weight-quantization-group-size", 0));
  return ParseWeightQuantization(args.StringOr("weight-quantization", "none"),
                                 static_cast<int>(std::clamp<int64_t>(group, -2, 1 << 20)));
}

std::string WeightFormatName(DType dtype, const kernels::QuantFormat& quant) {
  return quant.bits == 0 ? std::string(DTypeName(dtype)) : QuantizationName(quant);
}

std::string QuantizationName(const kernels::QuantFormat& quant) {
  if (quant.bits == 0) return "";
  std::string name = absl::StrCat("int", quant.bits);
  if (quant.group_size > 0) absl::StrAppend(&name, "-g", quant.group_size);
  if (quant.has_zero) absl::StrAppend(&name, "-zp");
  return name;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(const std::string& dir,
                                                                 const ModelConfig& c,
                                                                 const WeightLoadOptions& options) {
  const QuantizationConfig& q = c.quantization;
  if (q.quantized()) {
    if (q.method != QuantizationConfig::Method::kGptq) {
      return absl::UnimplementedError(absl::StrCat(
          dir, " holds quantized weights (", q.Name(),
          ", from config.json's quantization_config); of the quantized formats Tandem loads GPTQ "
          "today, AWQ and compressed-tensors are planned. Serve the model's float "
          "(bf16/f16/f32) checkpoint or a GPTQ one"));
    }
    if (q.act_order) {
      return absl::UnimplementedError(
          absl::StrCat(dir, " holds quantized weights (", q.Name(),
                       "): act-order (quantization_config.desc_act) GPTQ checkpoints are planned"));
    }
    if (q.lm_head) {
      return absl::UnimplementedError(absl::StrCat(
          dir, ": quantization_config.lm_head is true; a quantized lm_head is planned"));
    }
    if (options.quantize.bits != 0) {
      return absl::InvalidArgumentError(absl::StrCat("model.weight_quantization: ", dir,
                                                     " is already quantized (", q.Name(),
                                                     "); leave model.weight_quantization at none"));
    }
  }
  auto w = std::make_unique<ModelWeights>();
  const bool packs = options.memory == WeightMemory::kHugePages;
  if (packs || options.quantize.bits != 0 || q.quantized()) {
    w->arena_ = std::make_unique<HugePageArena>();
  }
  w->quant = options.quantize;
  w->quantization = q.quantized() ? q.Name() : QuantizationName(options.quantize);
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> paths, ListWeightFiles(dir));
  for (const auto& path : paths) {
    TANDEM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    w->files_.push_back(std::move(file));
  }
  ThreadPool serial(1);
  WeightBinder b(*w, dir, options.pool != nullptr ? *options.pool : serial);
  TANDEM_RETURN_IF_ERROR(b.Index());
  b.set_packs(packs);
  b.set_quantize(options.quantize);
  if (q.quantized()) b.set_gptq(&q);
  TANDEM_ASSIGN_OR_RETURN(w->embed_tokens,
                          b.Matrix("model.embed_tokens.weight", c.vocab_size, c.hidden_size));
  w->dtype = w->embed_tokens.dtype;
  w->layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    TANDEM_RETURN_IF_ERROR(BindLayer(b, c, i, w->layers[i]));
  }
  if (q.quantized()) w->quant = w->layers[0].q_proj.quant;
  TANDEM_ASSIGN_OR_RETURN(w->final_norm, b.Vector("model.norm.weight", c.hidden_size));
  if (c.tie_word_embeddings) {
    // Some tied checkpoints still store lm_head; HF ties it to the embedding regardless.
    b.Ignore("lm_head.weight");
    w->lm_head = w->embed_tokens;
  } else {
    TANDEM_ASSIGN_OR_RETURN(w->lm_head, b.Matrix("lm_head.weight", c.vocab_size, c.hidden_size));
  }
  TANDEM_RETURN_IF_ERROR(b.CheckAllUsed());
  // Every matrix now lives in the arena and every vector was converted: the mappings would
  // only keep the files' pages charged to the process (twice the model in RSS).
  if (packs) w->files_.clear();
  return w;
}

}  // namespace tandem::model
