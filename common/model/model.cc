#include "common/model/model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/cpu_backend.h"
#include "common/util/check.h"
#include "common/util/status_macros.h"

namespace tandem::model {

absl::Status Model::Workspace::Reserve(kernels::Backend& b, const ModelConfig& c, int64_t t) {
  const int64_t q = int64_t{c.num_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim;
  for (auto [buffer, floats] : {std::pair{&hidden, t * c.hidden_size},
                                {&normed, t * c.hidden_size},
                                {&proj, t * c.hidden_size},
                                {&gathered, t * c.hidden_size},
                                {&this->q, t * q},
                                {&attn, t * q},
                                {&k, t * kv},
                                {&v, t * kv},
                                {&gate_up, t * 2 * c.intermediate_size},
                                {&mlp, t * c.intermediate_size}}) {
    TANDEM_RETURN_IF_ERROR(buffer->Reserve(b, static_cast<size_t>(floats)));
  }
  if (tokens.size() < static_cast<size_t>(t)) tokens.resize(t);
  if (positions.size() < static_cast<size_t>(t)) positions.resize(t);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, ThreadPool& pool,
                                                   const WeightLoadOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromDirectory(dir));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                          kernels::CreateBackend(options.device, pool));
  WeightLoadOptions load = options;
  if (load.pool == nullptr) load.pool = &pool;
  // A device backend copies the row-major matrices once; panels are the CPU GEMM's format.
  if (!backend->host_addressable()) {
    if (load.quantize.bits != 0 || load.lm_head_quantize.bits != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          load.quantize.bits != 0 ? "model.weight_quantization" : "model.lm_head_quantization",
          " runs on the CPU backend only (", backend->Describe(),
          " was asked for); quantized CUDA kernels are planned"));
    }
    if (config.quantization.quantized()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, " holds quantized weights (", config.quantization.Name(),
                       "), which run on the CPU backend only (", backend->Describe(),
                       " was asked for); quantized CUDA kernels are planned"));
    }
    load.memory = WeightMemory::kMmap;
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                          ModelWeights::Load(dir, config, load));
  return Create(std::move(config), std::move(weights), std::move(backend), pool);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(ModelConfig config,
                                                     std::unique_ptr<ModelWeights> weights,
                                                     std::unique_ptr<kernels::Backend> backend,
                                                     ThreadPool& pool) {
  std::unique_ptr<Model> m(
      new Model(std::move(config), std::move(weights), std::move(backend), pool));
  TANDEM_RETURN_IF_ERROR(m->BindWeights());
  return m;
}

Model::Model(ModelConfig config, std::unique_ptr<ModelWeights> weights, ThreadPool& pool)
    : Model(std::move(config), std::move(weights), std::make_unique<kernels::CpuBackend>(pool),
            pool) {
  const absl::Status bound = BindWeights();
  TANDEM_CHECK(bound.ok(), "the CPU backend reads every weight in place");
}

Model::Model(ModelConfig config, std::unique_ptr<ModelWeights> weights,
             std::unique_ptr<kernels::Backend> backend, ThreadPool& pool)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      backend_(std::move(backend)),
      pool_(pool),
      inv_freq_(config_.RopeInvFreq()),
      dims_{.hidden = config_.hidden_size,
            .heads = config_.num_heads,
            .kv_heads = config_.num_kv_heads,
            .head_dim = config_.head_dim,
            .q_width = int64_t{config_.num_heads} * config_.head_dim,
            .kv_width = int64_t{config_.num_kv_heads} * config_.head_dim,
            .eps = static_cast<float>(config_.rms_norm_eps)} {
  backend_->SetBf16Attention(weights_->bf16_attention);
}

absl::StatusOr<uint8_t*> Model::BackendKvMemory::Map(size_t bytes) {
  TANDEM_ASSIGN_OR_RETURN(void* p, backend_.Allocate(bytes));
  backend_.Zero(p, bytes);
  return static_cast<uint8_t*>(p);
}

// ws_ is declared after backend_, so its buffers go back to the backend before it is destroyed.
Model::~Model() = default;

absl::Status Model::BindWeights() {
  kernels::Backend& b = *backend_;
  // A vector's resident copy, or null for an absent (empty) one.
  auto vec = [&b](const std::vector<float>& v) -> absl::StatusOr<const float*> {
    if (v.empty()) return nullptr;
    TANDEM_ASSIGN_OR_RETURN(const void* p, b.Resident(v.data(), v.size() * sizeof(float)));
    return static_cast<const float*>(p);
  };
  layers_.resize(weights_->layers.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerWeights& w = weights_->layers[l];
    LayerView& d = layers_[l];
    TANDEM_ASSIGN_OR_RETURN(d.input_norm, vec(w.input_norm));
    TANDEM_ASSIGN_OR_RETURN(d.q_bias, vec(w.q_bias));
    TANDEM_ASSIGN_OR_RETURN(d.k_bias, vec(w.k_bias));
    TANDEM_ASSIGN_OR_RETURN(d.v_bias, vec(w.v_bias));
    TANDEM_ASSIGN_OR_RETURN(d.q_norm, vec(w.q_norm));
    TANDEM_ASSIGN_OR_RETURN(d.k_norm, vec(w.k_norm));
    TANDEM_ASSIGN_OR_RETURN(d.post_attention_norm, vec(w.post_attention_norm));
    for (auto [dst, src] : {std::pair{&d.q_proj, &w.q_proj},
                            {&d.k_proj, &w.k_proj},
                            {&d.v_proj, &w.v_proj},
                            {&d.o_proj, &w.o_proj},
                            {&d.gate_proj, &w.gate_proj},
                            {&d.up_proj, &w.up_proj},
                            {&d.down_proj, &w.down_proj}}) {
      TANDEM_ASSIGN_OR_RETURN(*dst, b.ResidentWeight(*src));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(embed_tokens_, b.ResidentWeight(weights_->embed_tokens));
  TANDEM_ASSIGN_OR_RETURN(lm_head_, b.ResidentWeight(weights_->lm_head));
  TANDEM_ASSIGN_OR_RETURN(final_norm_, vec(weights_->final_norm));
  TANDEM_ASSIGN_OR_RETURN(inv_freq_resident_, vec(inv_freq_));
  return absl::OkStatus();
}

absl::Status Model::Validate(std::span<const ForwardSequence> batch, const kv::KvLayout& layout,
                             int64_t* total_tokens) const {
  if (layout.num_layers != config_.num_layers || layout.num_kv_heads != config_.num_kv_heads ||
      layout.head_dim != config_.head_dim) {
    return absl::InvalidArgumentError("KV layout does not match the model geometry");
  }
  int64_t total = 0;
  for (const auto& s : batch) {
    if (s.num_tokens <= 0 || s.tokens == nullptr || s.block_table == nullptr || s.start_pos < 0) {
      return absl::InvalidArgumentError("forward batch entry without tokens or block table");
    }
    if (s.start_pos + s.num_tokens > config_.ContextLength()) {
      return absl::InvalidArgumentError(absl::StrCat("positions up to ", s.start_pos + s.num_tokens,
                                                     " exceed the model context of ",
                                                     config_.ContextLength(), " tokens"));
    }
    for (int i = 0; i < s.num_tokens; ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", s.tokens[i], " is outside the vocabulary [0, ", config_.vocab_size, ")"));
      }
    }
    total += s.num_tokens;
  }
  *total_tokens = total;
  return absl::OkStatus();
}

absl::Status Model::Forward(std::span<const ForwardSequence> batch, uint8_t* kv_base,
                            const kv::KvLayout& layout, std::vector<float>& logits,
                            const PruningPlan* pruning, ForwardProbe* probe) {
  return Forward(batch, kv::KvArena{.base = kv_base, .layout = layout}, logits, pruning, probe);
}

absl::Status Model::Forward(std::span<const ForwardSequence> batch, const kv::KvArena& kv,
                            std::vector<float>& logits, const PruningPlan* pruning,
                            ForwardProbe* probe) {
  int64_t total = 0;
  TANDEM_RETURN_IF_ERROR(Validate(batch, kv.layout, &total));
  if (pruning != nullptr &&
      (static_cast<int64_t>(pruning->pruned_layers.size()) != config_.num_layers ||
       static_cast<int64_t>(pruning->full_depth.size()) != total)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pruning plan for ", pruning->pruned_layers.size(), " layers and ",
                     pruning->full_depth.size(), " tokens; the model has ", config_.num_layers,
                     " layers and the batch ", total, " tokens"));
  }
  if (probe != nullptr && !probe->residual_gates.empty() &&
      static_cast<int64_t>(probe->residual_gates.size()) != config_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("residual gates for ",
                                                   probe->residual_gates.size(),
                                                   " layers; the model has ", config_.num_layers));
  }
  logits.clear();
  if (total == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(ws_.Reserve(*backend_, config_, total));
  ws_.full_rows.clear();
  ws_.full_positions.clear();
  Embed(batch, total);
  if (pruning != nullptr) {
    for (int64_t t = 0; t < total; ++t) {
      if (pruning->full_depth[t] == 0) continue;
      ws_.full_rows.push_back(t);
      ws_.full_positions.push_back(ws_.positions[t]);
    }
  }
  const bool prunes = pruning != nullptr && static_cast<int64_t>(ws_.full_rows.size()) < total;
  probe_ = probe;
  const bool record = probe != nullptr && probe->record != ForwardProbe::Record::kNone;
  const int64_t h = config_.hidden_size;
  // The recorded hidden rows: all, or the last.
  const int64_t first_row =
      record && probe->record == ForwardProbe::Record::kLastRow ? total - 1 : 0;
  if (record) {
    probe->hidden.assign(config_.num_layers + 1, {});
    probe->attention.assign(config_.num_layers, {});
    probe->last_query.assign(config_.num_layers, {});
  }
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    if (record) probe->hidden[layer] = ReadRows(ws_.hidden.data(), first_row, total - first_row, h);
    if (prunes && pruning->pruned_layers[layer] != 0) {
      PrunedLayer(layer, batch, total, kv);
      continue;
    }
    AttentionBlock(layer, batch, total, kv);
    MlpBlock(layer, ws_.hidden.data(), total);
  }
  if (record) probe->hidden.back() = ReadRows(ws_.hidden.data(), first_row, total - first_row, h);
  probe_ = nullptr;
  TANDEM_RETURN_IF_ERROR(ComputeLogits(batch, logits));
  return backend_->Finish();
}

void Model::Embed(std::span<const ForwardSequence> batch, int64_t total) {
  int64_t t = 0;
  ws_.kv_writes.clear();
  for (const auto& s : batch) {
    ws_.kv_writes.push_back({.row = t,
                             .num_tokens = s.num_tokens,
                             .start_pos = s.start_pos,
                             .block_table = s.block_table});
    for (int i = 0; i < s.num_tokens; ++i, ++t) {
      ws_.tokens[t] = s.tokens[i];
      ws_.positions[t] = s.start_pos + i;
    }
  }
  backend_->Embed(embed_tokens_, ws_.tokens.data(), total, ws_.hidden.data());
}

void Model::ProjectKv(int layer, int64_t rows, const kv::KvArena& kv, float* queries) {
  const LayerView& w = layers_[layer];
  const auto [h, nh, nkv, hd, qw, kvw, eps] = dims_;
  if (w.k_norm != nullptr)
    backend_->RmsNorm(ws_.k.data(), w.k_norm, eps, rows * nkv, hd, ws_.k.data());
  backend_->Rope(queries, nh, ws_.k.data(), nkv, hd, rows, ws_.positions.data(),
                 inv_freq_resident_);
  backend_->WriteKv(ws_.k.data(), ws_.v.data(), ws_.kv_writes, kv, layer);
}

void Model::AttentionBlock(int layer, std::span<const ForwardSequence> batch, int64_t total,
                           const kv::KvArena& kv) {
  const LayerView& w = layers_[layer];
  const auto [h, nh, nkv, hd, qw, kvw, eps] = dims_;

  backend_->RmsNorm(ws_.hidden.data(), w.input_norm, eps, total, h, ws_.normed.data());
  const kernels::GemmOutput qkv[] = {
      {w.q_proj, w.q_bias, ws_.q.data(), qw},
      {w.k_proj, w.k_bias, ws_.k.data(), kvw},
      {w.v_proj, w.v_bias, ws_.v.data(), kvw},
  };
  backend_->GemmMulti(ws_.normed.data(), total, h, qkv);
  if (w.q_norm != nullptr)
    backend_->RmsNorm(ws_.q.data(), w.q_norm, eps, total * nh, hd, ws_.q.data());
  ProjectKv(layer, total, kv, ws_.q.data());

  auto& seqs = ws_.attention;
  seqs.clear();
  int64_t t = 0;
  for (const auto& s : batch) {
    seqs.push_back({.q = ws_.q.data() + t * qw,
                    .out = ws_.attn.data() + t * qw,
                    .num_tokens = s.num_tokens,
                    .start_pos = s.start_pos,
                    .block_table = s.block_table});
    t += s.num_tokens;
  }
  backend_->PagedAttention(seqs, nh, kv, layer, 1.0f / std::sqrt(static_cast<float>(hd)));
  backend_->Gemm(ws_.attn.data(), total, qw, w.o_proj, nullptr, ws_.proj.data(), h);
  RecordAttention(layer, total, nullptr, total - 1);
  GateBranch(layer, total);
  backend_->Add(ws_.hidden.data(), ws_.proj.data(), total * h);
}

std::vector<float> Model::ReadRows(const float* src, int64_t first, int64_t rows, int64_t width) {
  std::vector<float> out(rows * width);
  backend_->CopyToHost(out.data(), src + first * width, out.size() * sizeof(float));
  return out;
}

void Model::RecordAttention(int layer, int64_t total, const std::vector<int64_t>* rows,
                            int64_t last_query_row) {
  if (probe_ == nullptr || probe_->record == ForwardProbe::Record::kNone) return;
  const int64_t h = config_.hidden_size;
  const bool last_only = probe_->record == ForwardProbe::Record::kLastRow;
  const int64_t first_row = last_only ? total - 1 : 0;
  std::vector<float>& out = probe_->attention[layer];
  out.assign((total - first_row) * h, 0.0f);
  // ws_.proj holds one row per computed row: every row, or the compacted `rows`.
  const int64_t computed = rows == nullptr ? total : static_cast<int64_t>(rows->size());
  const std::vector<float> proj = ReadRows(ws_.proj.data(), 0, computed, h);
  for (int64_t i = 0; i < computed; ++i) {
    const int64_t row = rows == nullptr ? i : (*rows)[i];
    if (row < first_row) continue;
    std::copy_n(proj.data() + i * h, h, out.data() + (row - first_row) * h);
  }
  if (last_query_row >= 0) {
    probe_->last_query[layer] = ReadRows(ws_.q.data(), last_query_row, 1, dims_.q_width);
  }
}

void Model::GateBranch(int layer, int64_t rows) {
  if (probe_ == nullptr || probe_->residual_gates.empty()) return;
  const float gate = probe_->residual_gates[layer];
  if (gate == 1.0f) return;
  backend_->Scale(ws_.proj.data(), gate, rows * config_.hidden_size);
}

void Model::PrunedLayer(int layer, std::span<const ForwardSequence> batch, int64_t total,
                        const kv::KvArena& kv) {
  const LayerView& w = layers_[layer];
  const auto [h, nh, nkv, hd, qw, kvw, eps] = dims_;
  const auto& full = ws_.full_rows;
  const int64_t nf = static_cast<int64_t>(full.size());

  // Every token's K/V, from the hidden state that reaches this layer.
  backend_->RmsNorm(ws_.hidden.data(), w.input_norm, eps, total, h, ws_.normed.data());
  const kernels::GemmOutput kv_outputs[] = {
      {w.k_proj, w.k_bias, ws_.k.data(), kvw},
      {w.v_proj, w.v_bias, ws_.v.data(), kvw},
  };
  backend_->GemmMulti(ws_.normed.data(), total, h, kv_outputs);
  ProjectKv(layer, total, kv, nullptr);
  if (nf == 0) {
    RecordAttention(layer, total, &full, -1);
    return;
  }

  // Queries, attention and output projection for the full-depth rows, compacted.
  backend_->GatherRows(ws_.normed.data(), h, full.data(), nf, ws_.gathered.data());
  backend_->Gemm(ws_.gathered.data(), nf, h, w.q_proj, w.q_bias, ws_.q.data(), qw);
  if (w.q_norm != nullptr)
    backend_->RmsNorm(ws_.q.data(), w.q_norm, eps, nf * nh, hd, ws_.q.data());
  backend_->Rope(ws_.q.data(), nh, nullptr, 0, hd, nf, ws_.full_positions.data(),
                 inv_freq_resident_);
  // One attention entry per run of consecutive full-depth tokens of a sequence.
  auto& seqs = ws_.attention;
  seqs.clear();
  int64_t t = 0, c = 0;
  for (const auto& s : batch) {
    const int64_t end = t + s.num_tokens;
    while (c < nf && full[c] < end) {
      int64_t run = 1;
      while (c + run < nf && full[c + run] == full[c] + run && full[c + run] < end) ++run;
      seqs.push_back({.q = ws_.q.data() + c * qw,
                      .out = ws_.attn.data() + c * qw,
                      .num_tokens = static_cast<int>(run),
                      .start_pos = s.start_pos + (full[c] - t),
                      .block_table = s.block_table});
      c += run;
    }
    t = end;
  }
  backend_->PagedAttention(seqs, nh, kv, layer, 1.0f / std::sqrt(static_cast<float>(hd)));
  backend_->Gemm(ws_.attn.data(), nf, qw, w.o_proj, nullptr, ws_.proj.data(), h);
  RecordAttention(layer, total, &full, full.back() == total - 1 ? nf - 1 : -1);
  GateBranch(layer, nf);

  // The residual and the MLP on the gathered hidden rows, written back.
  backend_->GatherRows(ws_.hidden.data(), h, full.data(), nf, ws_.gathered.data());
  backend_->Add(ws_.gathered.data(), ws_.proj.data(), nf * h);
  MlpBlock(layer, ws_.gathered.data(), nf);
  backend_->ScatterRows(ws_.gathered.data(), h, full.data(), nf, ws_.hidden.data());
}

void Model::MlpBlock(int layer, float* hidden, int64_t rows) {
  const LayerView& w = layers_[layer];
  const int64_t h = config_.hidden_size, f = config_.intermediate_size;
  backend_->RmsNorm(hidden, w.post_attention_norm, dims_.eps, rows, h, ws_.normed.data());
  const kernels::GemmOutput gate_up[] = {
      {w.gate_proj, nullptr, ws_.gate_up.data(), 2 * f},
      {w.up_proj, nullptr, ws_.gate_up.data() + f, 2 * f},
  };
  backend_->GemmMulti(ws_.normed.data(), rows, h, gate_up);
  backend_->SiluMul(ws_.gate_up.data(), rows, f, ws_.mlp.data());
  backend_->Gemm(ws_.mlp.data(), rows, f, w.down_proj, nullptr, ws_.proj.data(), h);
  GateBranch(layer, rows);
  backend_->Add(hidden, ws_.proj.data(), rows * h);
}

absl::Status Model::ComputeLogits(std::span<const ForwardSequence> batch,
                                  std::vector<float>& logits) {
  const int64_t h = config_.hidden_size, vocab = config_.vocab_size;
  ws_.logit_rows.clear();
  int64_t t = 0;
  for (const auto& s : batch) {
    if (s.logits == LogitsMode::kAll) {
      for (int i = 0; i < s.num_tokens; ++i) ws_.logit_rows.push_back(t + i);
    } else if (s.logits == LogitsMode::kLast) {
      ws_.logit_rows.push_back(t + s.num_tokens - 1);
    }
    t += s.num_tokens;
  }
  const int64_t rows = static_cast<int64_t>(ws_.logit_rows.size());
  if (rows == 0) return absl::OkStatus();
  backend_->GatherRows(ws_.hidden.data(), h, ws_.logit_rows.data(), rows, ws_.normed.data());
  backend_->RmsNorm(ws_.normed.data(), final_norm_, dims_.eps, rows, h, ws_.normed.data());
  logits.resize(rows * vocab);
  // Straight into the caller's vector where backend memory is the host's.
  float* out = logits.data();
  if (!backend_->host_addressable()) {
    TANDEM_RETURN_IF_ERROR(ws_.logits.Reserve(*backend_, static_cast<size_t>(rows * vocab)));
    out = ws_.logits.data();
  }
  backend_->Gemm(ws_.normed.data(), rows, h, lm_head_, nullptr, out, vocab);
  if (out != logits.data()) backend_->CopyToHost(logits.data(), out, logits.size() * sizeof(float));
  return absl::OkStatus();
}

}  // namespace tandem::model
