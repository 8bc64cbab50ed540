#include "common/planner/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"

namespace tandem::planner {
namespace {

struct Request {
  double arrival = 0;
  int32_t prompt = 0;
  int32_t output = 0;
  int32_t generated = 0;
  double first = -1;  // when the client has the first token
  double last = -1;
};

// A request's life on one engine. `total` tokens must be in the KV cache before the sequence
// emits its next token: the prompt, then one more for each token emitted.
struct Seq {
  int request = 0;
  int64_t total = 0;
  int64_t computed = 0;
  int64_t blocks = 0;
  int32_t emitted = 0;
  int32_t output = 0;         // tokens the request emits in all (on every engine)
  int32_t unsent = -1;        // tokens emitted here and not yet streamed; -1: none streamed yet
  bool prefill_only = false;  // a prefill replica's: leaves after its first token
  bool imported = false;      // a decode replica's, until its first step: its blocks come in
};

struct Scheduled {
  size_t index;  // into running
  int64_t tokens;
};

class SimEngine {
 public:
  SimEngine(const EngineLimits& limits, int block_size)
      : limits_(limits), block_size_(block_size), free_blocks_(limits.num_blocks) {}

  // Queued work the router balances on: tokens still to compute, plus one per sequence.
  int64_t Load() const { return queued_tokens_ + static_cast<int64_t>(running_.size()); }
  int64_t Sequences() const { return static_cast<int64_t>(running_.size() + waiting_.size()); }
  bool busy() const { return busy_; }
  void set_busy(bool busy) { busy_ = busy; }

  // The shared processes' work on this replica's core (EngineProfile::shared_overhead_seconds):
  // while it is idle, the core runs it until core_free_at; while it steps, what is taken
  // (stolen) extends the step.
  double core_free_at = 0;
  double stolen = 0;
  int64_t messages = 0;  // streamed by the current step (StepSeconds counts them)

  void Add(const Seq& s) {
    queued_tokens_ += s.total - s.computed;
    waiting_.push_back(s);
  }

  // One step as engine::Engine schedules it (docs/architecture.md, "One step"): every running
  // sequence gets min(pending, chunk_size, budget) tokens, blocks reserved first and the
  // newest sequence preempted when they run out; then waiting sequences are admitted in order.
  const std::vector<Scheduled>& Schedule(int64_t& preemptions) {
    batch_.clear();
    int64_t budget = limits_.max_num_batched_tokens;
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Seq& s = running_[i];
      const int64_t n = std::min({s.total - s.computed, int64_t{limits_.chunk_size}, budget});
      int64_t need = Blocks(s.computed + n) - s.blocks;
      while (need > free_blocks_ && running_.size() > i + 1) {
        Preempt(running_.size() - 1);
        ++preemptions;
      }
      if (need > free_blocks_) {  // alone and still too big: wait for blocks to free up
        Preempt(i);
        ++preemptions;
        break;
      }
      s.blocks += need;
      free_blocks_ -= need;
      budget -= n;
      batch_.push_back({i, n});
    }
    while (!waiting_.empty() && budget > 0 &&
           static_cast<int64_t>(running_.size()) < limits_.max_num_seqs) {
      Seq& w = waiting_.front();
      const int64_t n = std::min({w.total - w.computed, int64_t{limits_.chunk_size}, budget});
      const int64_t need = Blocks(w.computed + n) - w.blocks;
      if (need > free_blocks_) break;
      w.blocks += need;
      free_blocks_ -= need;
      budget -= n;
      running_.push_back(w);
      waiting_.pop_front();
      batch_.push_back({running_.size() - 1, n});
    }
    return batch_;
  }

  // Whether the token `s` emits next goes out in a message: the first on this engine, every
  // stream_interval-th after it, and the request's last.
  bool Streams(const Seq& s) const {
    return s.unsent < 0 || s.unsent + 1 >= limits_.stream_interval || s.emitted + 1 >= s.output;
  }

  // Seconds the scheduled batch takes: prefill tokens (chunks, and a decode replica's first
  // step of an imported prompt) and decode tokens in one forward pass.
  // Each sequence that completes its pending tokens emits a token; those that stream it (see
  // Streams; their count goes to `messages`) cost the profile's token_overhead_seconds on the
  // same core, and on a prefill replica hand their prompt off, costing
  // handoff_overhead_seconds more; a decode replica's first step of an imported sequence costs
  // import_overhead_seconds for bringing its blocks in.
  double StepSeconds(const StepModel& prefill, const StepModel& decode,
                     const EngineProfile& profile) {
    int64_t prefill_tokens = 0, decodes = 0, streamed = 0, handed_off = 0, imports = 0;
    double prefill_work = 0, decode_context = 0;
    for (const Scheduled& b : batch_) {
      const Seq& s = running_[b.index];
      const bool completes = s.computed + b.tokens == s.total;
      streamed += completes && Streams(s);
      handed_off += completes && s.prefill_only;
      imports += s.imported;
      if (s.emitted > 0 && b.tokens == 1) {
        ++decodes;
        decode_context += static_cast<double>(s.computed + 1);
      } else {
        prefill_tokens += b.tokens;
        prefill_work += StepModel::PrefillWork(b.tokens, s.computed);
      }
    }
    messages = streamed;
    const double overhead = profile.token_overhead_seconds * static_cast<double>(streamed) +
                            profile.handoff_overhead_seconds * static_cast<double>(handed_off) +
                            profile.import_overhead_seconds * static_cast<double>(imports);
    if (prefill_tokens == 0) return decode.Seconds(decodes, decode_context) + overhead;
    return prefill.Seconds(prefill_tokens + decodes, prefill_work) +
           decode.per_work() * decode_context + overhead;
  }

  // Applies the step's tokens; `emit(seq)` is called for every sequence that completes its
  // pending tokens and returns whether the sequence is done on this engine.
  void Finish(const std::function<bool(Seq&)>& emit) {
    for (const Scheduled& b : batch_) {
      Seq& s = running_[b.index];
      s.computed += b.tokens;
      s.imported = false;
      queued_tokens_ -= b.tokens;
      if (s.computed < s.total) continue;
      s.unsent = Streams(s) ? 0 : s.unsent + 1;
      ++s.emitted;
      if (emit(s)) {
        free_blocks_ += s.blocks;
        s.blocks = -1;  // marks it for removal
      } else {
        ++s.total;
        ++queued_tokens_;
      }
    }
    std::erase_if(running_, [](const Seq& s) { return s.blocks < 0; });
  }

 private:
  int64_t Blocks(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Drops a running sequence's KV; it recomputes from the start, at the front of the queue.
  void Preempt(size_t index) {
    Seq s = running_[index];
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
    free_blocks_ += s.blocks;
    queued_tokens_ += s.computed;
    s.blocks = 0;
    s.computed = 0;
    waiting_.push_front(s);
  }

  EngineLimits limits_;
  int block_size_;
  int64_t free_blocks_;
  int64_t queued_tokens_ = 0;
  bool busy_ = false;
  std::deque<Seq> waiting_;
  std::vector<Seq> running_;
  std::vector<Scheduled> batch_;
};

int32_t Draw(std::mt19937_64& rng, int32_t len, double range) {
  const auto lo = std::max<int64_t>(1, std::lround(len * (1.0 - range)));
  const auto hi = std::max<int64_t>(1, std::lround(len * (1.0 + range)));
  return static_cast<int32_t>(lo +
                              static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1)));
}

Percentiles Summarize(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  auto at = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const auto lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  return p;
}

enum class EventKind { kArrival, kStepEnd, kHandoff };

struct Event {
  double time;
  int64_t order;  // ties in insertion order: deterministic
  EventKind kind;
  int index;  // the request (arrival, handoff) or the engine (step end)
  bool operator>(const Event& o) const { return std::tie(time, order) > std::tie(o.time, o.order); }
};

}  // namespace

std::string Deployment::Describe() const {
  if (!disaggregated) {
    return absl::StrFormat("colocated %d (max_num_seqs %d)", replicas, engine.max_num_seqs);
  }
  return absl::StrFormat("disaggregated %dP+%dD (max_num_seqs %d)", prefill_replicas, replicas,
                         engine.max_num_seqs);
}

std::vector<double> TileTimestamps(std::span<const double> timestamps, int64_t n) {
  std::vector<double> out;
  if (timestamps.empty() || n <= 0) return out;
  const double span = timestamps.back() - timestamps.front();
  const double gap = timestamps.size() > 1 ? span / static_cast<double>(timestamps.size() - 1) : 0;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const auto m = static_cast<int64_t>(timestamps.size());
    out.push_back(timestamps[static_cast<size_t>(i % m)] +
                  static_cast<double>(i / m) * (span + gap));
  }
  return out;
}

double TraceRate(std::span<const double> timestamps) {
  if (timestamps.size() < 2) return 0;
  const double span = timestamps.back() - timestamps.front();
  return span > 0 ? static_cast<double>(timestamps.size() - 1) / span : 0;
}

std::vector<double> ReplayArrivals(std::span<const double> timestamps, double rate) {
  const double recorded = TraceRate(timestamps);
  const double scale = recorded > 0 && rate > 0 && std::isfinite(rate) ? recorded / rate : 1.0;
  std::vector<double> out;
  out.reserve(timestamps.size());
  for (double t : timestamps) out.push_back((t - timestamps.front()) * scale);
  return out;
}

std::vector<double> TraceSchedule(std::span<const double> timestamps, int64_t n, double rate) {
  if (TraceRate(timestamps) <= 0) return {};
  return ReplayArrivals(TileTimestamps(timestamps, n), rate);
}

absl::StatusOr<SimulationResult> Simulate(const EngineProfile& profile, const Deployment& d,
                                          const Workload& w, double rate) {
  if (!(rate > 0) || !std::isfinite(rate)) {
    return absl::InvalidArgumentError(absl::StrCat("rate must be positive, got ", rate));
  }
  if (w.num_requests < 1 || (w.trace.empty() && (w.input_len < 1 || w.output_len < 1))) {
    return absl::InvalidArgumentError("the workload needs requests with prompts and outputs");
  }
  // The same draws at every rate (arrival gaps scale with 1/rate), so a search over rates sees
  // one workload.
  std::mt19937_64 rng(w.seed);
  std::exponential_distribution<double> gap(1.0);
  std::vector<SimRequest> schedule(static_cast<size_t>(w.num_requests));
  std::vector<double> recorded;
  for (const SimRequest& r : w.trace) recorded.push_back(r.arrival);
  const std::vector<double> replayed = TraceSchedule(recorded, w.num_requests, rate);
  double t = 0;
  for (size_t i = 0; i < schedule.size(); ++i) {
    SimRequest& r = schedule[i];
    if (!replayed.empty()) {
      r.arrival = replayed[i];
    } else {
      t += gap(rng) / rate;
      r.arrival = t;
    }
    if (w.trace.empty()) {
      r.prompt = Draw(rng, w.input_len, w.input_len_range);
      r.output = Draw(rng, w.output_len, w.output_len_range);
    } else {
      r.prompt = w.trace[i % w.trace.size()].prompt;
      r.output = w.trace[i % w.trace.size()].output;
    }
  }
  return SimulateRequests(profile, d, schedule, w, rate);
}

absl::StatusOr<SimulationResult> SimulateRequests(const EngineProfile& profile, const Deployment& d,
                                                  const std::vector<SimRequest>& schedule,
                                                  const Workload& w, double rate) {
  if (d.replicas < 1 || (d.disaggregated && d.prefill_replicas < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(d.Describe(), ": every role needs at least one replica"));
  }
  if (schedule.empty()) return absl::InvalidArgumentError("no requests to simulate");
  const int bs = profile.block_size;
  int64_t longest = 0;
  for (const SimRequest& r : schedule) {
    if (r.prompt < 1 || r.output < 1 || !(r.arrival >= 0)) {
      return absl::InvalidArgumentError("every request needs a prompt, an output and a time");
    }
    longest = std::max<int64_t>(longest, int64_t{r.prompt} + r.output + 1);
  }
  for (const EngineLimits* l : {&d.engine, d.disaggregated ? &d.prefill : &d.engine}) {
    if (l->num_blocks * bs < longest || l->max_num_seqs < 1 || l->chunk_size < 1 ||
        l->max_num_batched_tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(d.Describe(), ": a replica's KV budget (", l->num_blocks * bs,
                       " tokens) or limits cannot hold one request of up to ", longest, " tokens"));
    }
  }
  TransferModel transfer;
  if (d.disaggregated) {
    TANDEM_ASSIGN_OR_RETURN(transfer, TransferModel::Fit(profile, d.transport));
  }
  TANDEM_ASSIGN_OR_RETURN(StepModel prefill, StepModel::Fit(profile.prefill, true, "profile"));
  TANDEM_ASSIGN_OR_RETURN(StepModel decode, StepModel::Fit(profile.decode, false, "profile"));

  std::vector<Request> requests(schedule.size());
  for (size_t i = 0; i < schedule.size(); ++i) {
    requests[i].arrival = schedule[i].arrival;
    requests[i].prompt = schedule[i].prompt;
    requests[i].output = schedule[i].output;
  }

  std::vector<SimEngine> engines;
  const int first_decode = d.disaggregated ? d.prefill_replicas : 0;
  for (int i = 0; i < first_decode; ++i) engines.emplace_back(d.prefill, bs);
  for (int i = 0; i < d.replicas; ++i) engines.emplace_back(d.engine, bs);

  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  int64_t order = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    events.push({requests[i].arrival, order++, EventKind::kArrival, static_cast<int>(i)});
  }
  SimulationResult result;
  result.rate = rate;
  auto start = [&](int e, double now) {
    SimEngine& engine = engines[static_cast<size_t>(e)];
    if (engine.busy() || engine.Schedule(result.preemptions).empty()) return;
    engine.set_busy(true);
    const double step = engine.StepSeconds(prefill, decode, profile);
    (e < first_decode ? result.prefill_busy_s : result.engine_busy_s) += step;
    events.push({std::max(now, engine.core_free_at) + step, order++, EventKind::kStepEnd, e});
  };
  // The shared processes' work for a step's `n` streamed messages, from `now`: on the idle
  // core that frees up first (the kernel wakes an unpinned thread on an idle core), else
  // time-shared with every stepping replica alike.
  auto share = [&](int64_t n, double now) {
    if (n == 0) return;
    const double work = profile.shared_step_overhead_seconds +
                        profile.shared_overhead_seconds * static_cast<double>(n);
    if (work <= 0) return;
    SimEngine* idle = nullptr;
    for (SimEngine& e : engines) {
      if (!e.busy() && (idle == nullptr || e.core_free_at < idle->core_free_at)) idle = &e;
    }
    if (idle != nullptr) {
      idle->core_free_at = std::max(idle->core_free_at, now) + work;
      return;
    }
    for (SimEngine& e : engines) e.stolen += work / static_cast<double>(engines.size());
  };
  // The router's picks (router/worker_pool.cc; docs/architecture.md, "One request through the
  // router"): prefill by fewest queued tokens, then sequences; decode by fewest sequences, then
  // queued tokens. A colocated replica is a decode worker to the router: picked as decode is.
  auto pick = [&](int begin, int end, bool by_tokens) {
    auto key = [&](int e) {
      const SimEngine& x = engines[static_cast<size_t>(e)];
      return by_tokens ? std::pair{x.Load(), x.Sequences()} : std::pair{x.Sequences(), x.Load()};
    };
    int best = begin;
    for (int e = begin + 1; e < end; ++e) {
      if (key(e) < key(best)) best = e;
    }
    return best;
  };
  const int64_t kv_per_token = profile.kv_bytes_per_token;
  double end_time = 0;
  while (!events.empty()) {
    const Event ev = events.top();
    events.pop();
    const double now = ev.time;
    if (ev.kind == EventKind::kArrival) {
      const Request& r = requests[static_cast<size_t>(ev.index)];
      Seq s{.request = ev.index,
            .total = r.prompt,
            .output = r.output,
            .prefill_only = d.disaggregated};
      const int e = d.disaggregated ? pick(0, first_decode, true)
                                    : pick(0, static_cast<int>(engines.size()), false);
      engines[static_cast<size_t>(e)].Add(s);
      start(e, now);
    } else if (ev.kind == EventKind::kHandoff) {
      // The decode replica imports the prompt's full blocks from the store and computes the
      // rest (the partial block and the first token) in its first step.
      const Request& r = requests[static_cast<size_t>(ev.index)];
      const int64_t imported = r.prompt / bs * bs;
      Seq s{.request = ev.index,
            .total = r.prompt + 1,
            .computed = imported,
            .emitted = 1,
            .output = r.output,
            .imported = true};
      const int e = pick(first_decode, static_cast<int>(engines.size()), false);
      engines[static_cast<size_t>(e)].Add(s);
      start(e, now);
    } else {
      SimEngine& engine = engines[static_cast<size_t>(ev.index)];
      if (engine.stolen > 0) {  // the shared processes held the core during the step
        events.push({now + engine.stolen, order++, EventKind::kStepEnd, ev.index});
        engine.stolen = 0;
        continue;
      }
      const int64_t streamed = engine.messages;
      engine.Finish([&](Seq& s) {
        Request& r = requests[static_cast<size_t>(s.request)];
        ++r.generated;
        if (s.prefill_only) {
          // The first token reaches the client with the KV handle, after the put; the decode
          // replica's get follows.
          const int64_t bytes = static_cast<int64_t>(r.prompt) / bs * bs * kv_per_token;
          const double put = transfer.Seconds(bytes);
          r.first = r.last = now + put;
          end_time = std::max(end_time, r.last);
          if (r.generated < r.output) {
            events.push({now + 2 * put, order++, EventKind::kHandoff, s.request});
          }
          return true;
        }
        if (r.first < 0) r.first = now;
        r.last = now;
        end_time = std::max(end_time, now);
        return r.generated >= r.output;
      });
      engine.set_busy(false);
      start(ev.index, now);
      share(streamed, now);
    }
  }

  std::vector<double> ttft, tpot;
  int64_t good = 0, prompt_tokens = 0, output_tokens = 0;
  for (const Request& r : requests) {
    if (r.generated < r.output) {
      return absl::InternalError("the simulation ended with a request unfinished");
    }
    const double first = r.first - r.arrival;
    ttft.push_back(first);
    const double per_token = r.output > 1 ? (r.last - r.first) / (r.output - 1) : 0;
    if (r.output > 1) tpot.push_back(per_token);
    const bool ok = (w.slo_ttft_s <= 0 || first <= w.slo_ttft_s) &&
                    (w.slo_tpot_s <= 0 || per_token <= w.slo_tpot_s);
    good += ok;
    prompt_tokens += r.prompt;
    output_tokens += r.output;
  }
  result.attainment = static_cast<double>(good) / static_cast<double>(requests.size());
  result.duration_s = end_time - requests.front().arrival;
  if (result.duration_s > 0) {
    result.throughput = static_cast<double>(requests.size()) / result.duration_s;
    result.goodput = static_cast<double>(good) / result.duration_s;
    result.output_tokens_per_s = static_cast<double>(output_tokens) / result.duration_s;
    result.total_tokens_per_s =
        static_cast<double>(prompt_tokens + output_tokens) / result.duration_s;
  }
  result.ttft = Summarize(std::move(ttft));
  result.tpot = Summarize(std::move(tpot));
  return result;
}

}  // namespace tandem::planner
