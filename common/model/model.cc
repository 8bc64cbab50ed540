#include "common/model/model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/attention.h"
#include "common/kernels/cpu/elementwise.h"
#include "common/kernels/cpu/gemm.h"
#include "common/util/status_macros.h"

namespace tandem::model {
namespace {

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

const float* BiasOrNull(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }

// RoPE on `rows` rows of `heads` heads each, row r at positions[r].
void RopeRows(float* x, int heads, int head_dim, int64_t rows, const int64_t* positions,
              const float* inv_freq, ThreadPool& pool) {
  const int64_t width = int64_t{heads} * head_dim;
  pool.ParallelFor(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      kernels::ApplyRope(x + r * width, heads, head_dim, positions[r], inv_freq);
    }
  });
}

}  // namespace

void Model::Workspace::Reserve(const ModelConfig& c, int64_t t) {
  int64_t q = int64_t{c.num_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim;
  Grow(hidden, t * c.hidden_size);
  Grow(normed, t * c.hidden_size);
  Grow(proj, t * c.hidden_size);
  Grow(this->q, t * q);
  Grow(attn, t * q);
  Grow(k, t * kv);
  Grow(v, t * kv);
  Grow(gate_up, t * 2 * c.intermediate_size);
  Grow(mlp, t * c.intermediate_size);
  Grow(positions, t);
  Grow(gathered, t * c.hidden_size);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, ThreadPool& pool,
                                                   const WeightLoadOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromDirectory(dir));
  WeightLoadOptions load = options;
  if (load.pool == nullptr) load.pool = &pool;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                          ModelWeights::Load(dir, config, load));
  return std::make_unique<Model>(std::move(config), std::move(weights), pool);
}

Model::Model(ModelConfig config, std::unique_ptr<ModelWeights> weights, ThreadPool& pool)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      pool_(pool),
      inv_freq_(config_.RopeInvFreq()),
      dims_{.hidden = config_.hidden_size,
            .heads = config_.num_heads,
            .kv_heads = config_.num_kv_heads,
            .head_dim = config_.head_dim,
            .q_width = int64_t{config_.num_heads} * config_.head_dim,
            .kv_width = int64_t{config_.num_kv_heads} * config_.head_dim,
            .eps = static_cast<float>(config_.rms_norm_eps)} {}

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
  logits.clear();
  if (total == 0) return absl::OkStatus();
  ws_.Reserve(config_, total);
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
  if (probe != nullptr && !probe->residual_gates.empty() &&
      static_cast<int64_t>(probe->residual_gates.size()) != config_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("residual gates for ",
                                                   probe->residual_gates.size(),
                                                   " layers; the model has ", config_.num_layers));
  }
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
    if (record) {
      probe->hidden[layer].assign(ws_.hidden.data() + first_row * h, ws_.hidden.data() + total * h);
    }
    if (prunes && pruning->pruned_layers[layer] != 0) {
      PrunedLayer(layer, batch, total, kv);
      continue;
    }
    AttentionBlock(layer, batch, total, kv);
    MlpBlock(layer, ws_.hidden.data(), total);
  }
  if (record) {
    probe->hidden.back().assign(ws_.hidden.data() + first_row * h, ws_.hidden.data() + total * h);
  }
  probe_ = nullptr;
  ComputeLogits(batch, logits);
  return absl::OkStatus();
}

void Model::Embed(std::span<const ForwardSequence> batch, int64_t total) {
  const int64_t h = config_.hidden_size;
  int64_t t = 0;
  for (const auto& s : batch) {
    for (int i = 0; i < s.num_tokens; ++i, ++t) {
      kernels::ReadRow(weights_->embed_tokens, s.tokens[i], ws_.hidden.data() + t * h);
      ws_.positions[t] = s.start_pos + i;
    }
  }
}

void Model::ProjectKv(int layer, std::span<const ForwardSequence> batch, int64_t rows,
                      const kv::KvArena& kv, float* queries) {
  const LayerWeights& w = weights_->layers[layer];
  const auto [h, nh, nkv, hd, qw, kvw, eps] = dims_;
  if (config_.qk_norm) {
    kernels::RmsNorm(ws_.k.data(), w.k_norm.data(), eps, rows * nkv, hd, ws_.k.data());
  }
  // One parallel pass for both, as this runs for every layer of every step. (Lambdas capture
  // dims_ through `this`: clang 14, the fuzz build's compiler, cannot capture structured
  // bindings.)
  pool_.ParallelFor(rows, 16, [&](int64_t b, int64_t e) {
    const Dims& d = dims_;
    for (int64_t r = b; r < e; ++r) {
      const int64_t pos = ws_.positions[r];
      if (queries) {
        kernels::ApplyRope(queries + r * d.q_width, d.heads, d.head_dim, pos, inv_freq_.data());
      }
      kernels::ApplyRope(ws_.k.data() + r * d.kv_width, d.kv_heads, d.head_dim, pos,
                         inv_freq_.data());
    }
  });
  int64_t t = 0;
  for (const auto& s : batch) {
    kernels::WriteKv(ws_.k.data() + t * kvw, ws_.v.data() + t * kvw, s.num_tokens, s.start_pos,
                     s.block_table, kv, layer);
    t += s.num_tokens;
  }
}

void Model::AttentionBlock(int layer, std::span<const ForwardSequence> batch, int64_t total,
                           const kv::KvArena& kv) {
  const LayerWeights& w = weights_->layers[layer];
  const auto [h, nh, nkv, hd, qw, kvw, eps] = dims_;

  kernels::RmsNorm(ws_.hidden.data(), w.input_norm.data(), eps, total, h, ws_.normed.data());
  const kernels::GemmOutput qkv[] = {
      {w.q_proj, BiasOrNull(w.q_bias), ws_.q.data(), qw},
      {w.k_proj, BiasOrNull(w.k_bias), ws_.k.data(), kvw},
      {w.v_proj, BiasOrNull(w.v_bias), ws_.v.data(), kvw},
  };
  kernels::GemmMulti(ws_.normed.data(), total, h, qkv, pool_);
  if (config_.qk_norm) {
    kernels::RmsNorm(ws_.q.data(), w.q_norm.data(), eps, total * nh, hd, ws_.q.data());
  }
  ProjectKv(layer, batch, total, kv, ws_.q.data());

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
  kernels::PagedAttention(seqs.data(), static_cast<int>(seqs.size()), nh, kv, layer,
                          1.0f / std::sqrt(static_cast<float>(hd)), pool_);
  kernels::Gemm(ws_.attn.data(), total, qw, w.o_proj, nullptr, ws_.proj.data(), h, pool_);
  RecordAttention(layer, total, nullptr, total - 1);
  GateBranch(layer, total);
  kernels::AddInPlace(ws_.hidden.data(), ws_.proj.data(), total * h);
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
  for (int64_t i = 0; i < computed; ++i) {
    const int64_t row = rows == nullptr ? i : (*rows)[i];
    if (row < first_row) continue;
    std::copy_n(ws_.proj.data() + i * h, h, out.data() + (row - first_row) * h);
  }
  if (last_query_row >= 0) {
    const float* q = ws_.q.data() + last_query_row * dims_.q_width;
    probe_->last_query[layer].assign(q, q + dims_.q_width);
  }
}

void Model::GateBranch(int layer, int64_t rows) {
  if (probe_ == nullptr || probe_->residual_gates.empty()) return;
  const float gate = probe_->residual_gates[layer];
  if (gate == 1.0f) return;
  float* proj = ws_.proj.data();
  for (int64_t i = 0; i < rows * config_.hidden_size; ++i) proj[i] *= gate;
}

void Model::PrunedLayer(int layer, std::span<const ForwardSequence> batch, int64_t total,
                        const kv::KvArena& kv) {
  const LayerWeights& w = weights_->layers[layer];
  const auto [h, nh, nkv, hd, qw, kvw, eps] = dims_;
  const auto& full = ws_.full_rows;
  const int64_t nf = static_cast<int64_t>(full.size());

  // Every token's K/V, from the hidden state that reaches this layer.
  kernels::RmsNorm(ws_.hidden.data(), w.input_norm.data(), eps, total, h, ws_.normed.data());
  const kernels::GemmOutput kv_outputs[] = {
      {w.k_proj, BiasOrNull(w.k_bias), ws_.k.data(), kvw},
      {w.v_proj, BiasOrNull(w.v_bias), ws_.v.data(), kvw},
  };
  kernels::GemmMulti(ws_.normed.data(), total, h, kv_outputs, pool_);
  ProjectKv(layer, batch, total, kv, nullptr);
  if (nf == 0) {
    RecordAttention(layer, total, &full, -1);
    return;
  }

  // Queries, attention and output projection for the full-depth rows, compacted.
  for (int64_t i = 0; i < nf; ++i) {
    std::copy_n(ws_.normed.data() + full[i] * h, h, ws_.gathered.data() + i * h);
  }
  kernels::Gemm(ws_.gathered.data(), nf, h, w.q_proj, BiasOrNull(w.q_bias), ws_.q.data(), qw,
                pool_);
  if (config_.qk_norm) {
    kernels::RmsNorm(ws_.q.data(), w.q_norm.data(), eps, nf * nh, hd, ws_.q.data());
  }
  RopeRows(ws_.q.data(), nh, hd, nf, ws_.full_positions.data(), inv_freq_.data(), pool_);
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
  kernels::PagedAttention(seqs.data(), static_cast<int>(seqs.size()), nh, kv, layer,
                          1.0f / std::sqrt(static_cast<float>(hd)), pool_);
  kernels::Gemm(ws_.attn.data(), nf, qw, w.o_proj, nullptr, ws_.proj.data(), h, pool_);
  RecordAttention(layer, total, &full, full.back() == total - 1 ? nf - 1 : -1);
  GateBranch(layer, nf);

  // The MLP on the gathered hidden rows, written back.
  for (int64_t i = 0; i < nf; ++i) {
    float* row = ws_.hidden.data() + full[i] * h;
    kernels::AddInPlace(row, ws_.proj.data() + i * h, h);
    std::copy_n(row, h, ws_.gathered.data() + i * h);
  }
  MlpBlock(layer, ws_.gathered.data(), nf);
  for (int64_t i = 0; i < nf; ++i) {
    std::copy_n(ws_.gathered.data() + i * h, h, ws_.hidden.data() + full[i] * h);
  }
}

void Model::MlpBlock(int layer, float* hidden, int64_t rows) {
  const LayerWeights& w = weights_->layers[layer];
  const int64_t h = config_.hidden_size, f = config_.intermediate_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  kernels::RmsNorm(hidden, w.post_attention_norm.data(), eps, rows, h, ws_.normed.data());
  const kernels::GemmOutput gate_up[] = {
      {w.gate_proj, nullptr, ws_.gate_up.data(), 2 * f},
      {w.up_proj, nullptr, ws_.gate_up.data() + f, 2 * f},
  };
  kernels::GemmMulti(ws_.normed.data(), rows, h, gate_up, pool_);
  kernels::SiluMul(ws_.gate_up.data(), rows, f, ws_.mlp.data());
  kernels::Gemm(ws_.mlp.data(), rows, f, w.down_proj, nullptr, ws_.proj.data(), h, pool_);
  GateBranch(layer, rows);
  kernels::AddInPlace(hidden, ws_.proj.data(), rows * h);
}

void Model::ComputeLogits(std::span<const ForwardSequence> batch, std::vector<float>& logits) {
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
  if (rows == 0) return;
  // Gather the wanted rows (ascending, so in-place compaction is safe), then norm + lm_head.
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = ws_.hidden.data() + ws_.logit_rows[r] * h;
    std::copy(src, src + h, ws_.normed.data() + r * h);
  }
  kernels::RmsNorm(ws_.normed.data(), weights_->final_norm.data(),
                   static_cast<float>(config_.rms_norm_eps), rows, h, ws_.normed.data());
  logits.resize(rows * vocab);
  kernels::Gemm(ws_.normed.data(), rows, h, weights_->lm_head, nullptr, logits.data(), vocab,
                pool_);
}

}  // namespace tandem::model
