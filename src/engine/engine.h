// Engine: the step loop that serves many requests on one model. Each step batches every active
// request's next decode token and prefill chunks (at most max_write tokens each) under a per-step
// token budget, runs one forward pass, samples, and streams tokens. New requests join between
// steps; finished or cancelled ones leave at once.
//
// Prefix reuse: a finished request's sequence stays cached (least recently used first out). A new
// request takes the cached sequence sharing the longest prefix with its prompt, rewinds it where
// they diverge (or, when the rings have moved on, restores the snapshot taken at that sequence's
// prompt end) and computes only the rest. This is what makes agent loops cheap on sliding-window
// models: resending the history with a tool result recomputes only what follows the last prompt.
#pragma once

#include "base/status.h"
#include "kv/kv_store.h"
#include "model/forward.h"
#include "sample/sampler.h"

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace offgraph::engine {

struct EngineOptions {
  int32_t context = 4096;    // per sequence: prompt + generated tokens
  int32_t max_write = 256;   // largest prefill chunk
  int32_t step_tokens = 512; // token budget of one step (decodes first, then prefill chunks)
  int32_t max_active = 8;    // requests computed together
  int32_t max_cached = 8;    // finished sequences kept for prefix reuse
  size_t max_queue = 64;     // waiting requests; more are refused
  kv::StorageTypes types;
  int threads = 2;
};

enum class FinishReason { None, Stop, Length, Cancelled, Error };

struct Request {
  std::vector<int32_t> prompt;
  sample::SamplingParams sampling;
  int32_t max_tokens = 256;
  std::vector<int32_t> stop_tokens; // end-of-turn ids (never <|eom|>)
  // Choices: the prompt is computed once and its cache forked into n sequences; choice i samples
  // with seed + i.
  int32_t n = 1;
};

struct Event {
  uint64_t request = 0;
  int32_t token = -1;                       // a generated token, or -1 when only finishing
  FinishReason finish = FinishReason::None; // set on the request's last event
  std::string error;                        // with FinishReason::Error
  int32_t cached_tokens = 0;                // on the last event: prompt tokens reused, not computed
  int32_t choice = 0;                       // which of the request's n choices
};

struct EngineStats {
  int64_t steps = 0, prompt_tokens = 0, computed_prompt_tokens = 0, reused_prompt_tokens = 0,
          generated_tokens = 0, snapshot_restores = 0;
};

class Engine {
public:
  static Result<std::unique_ptr<Engine>> create(const model::Model &model, EngineOptions options);

  // Queues a request; events go to `on_event` from step(). Refused up front, with the numbers,
  // when prompt + max_tokens cannot fit the context or the queue is full.
  Result<uint64_t> submit(Request request, std::function<void(const Event &)> on_event);
  // The request ends (FinishReason::Cancelled) at the next step; its sequence is freed then.
  void cancel(uint64_t id);
  // One step. False when there was nothing to do.
  bool step();
  // Steps until every request has finished.
  void run_until_idle();

  const EngineStats &stats() const { return stats_; }
  size_t active() const { return active_.size(); }
  size_t queued() const { return queue_.size(); }
  size_t cached() const { return cached_.size(); }
  const kv::KvStore &store() const { return *store_; }

private:
  struct Active {
    uint64_t id = 0;
    Request request;
    std::function<void(const Event &)> on_event;
    std::optional<sample::Sampler> sampler;
    kv::SeqId seq = 0;
    std::vector<int32_t> tokens; // what the sequence holds, then the prompt's rest and picks
    size_t computed = 0;         // tokens[0, computed) are in the cache
    int32_t generated = 0;
    bool cancelled = false;
    int32_t reused = 0; // prompt tokens found in the cache
    int32_t choice = 0;
    std::unique_ptr<kv::Snapshot> prompt_snapshot;
  };
  struct Cached {
    kv::SeqId seq;
    std::vector<int32_t> tokens;                   // exactly what the sequence holds
    std::unique_ptr<kv::Snapshot> prompt_snapshot; // at the end of its prompt, if any
    uint64_t last_used;
  };

  Engine(const model::Model &model, EngineOptions options) : model_(model), options_(options) {}
  Status admit(Active &a);
  void finish(Active &a, FinishReason reason, const std::string &error = "");
  // Samples a's next token from `logits` and streams it; false once a is finished.
  bool advance(Active &a, std::span<const float> logits);
  // The other n - 1 choices of a request whose prompt was just computed, forked from it.
  void spawn_choices(Active &a, std::span<const float> logits,
                     std::vector<std::unique_ptr<Active>> &born);

  const model::Model &model_;
  EngineOptions options_;
  std::unique_ptr<kv::KvStore> store_;
  std::unique_ptr<model::Forward> forward_;
  std::deque<std::unique_ptr<Active>> queue_;
  std::vector<std::unique_ptr<Active>> active_;
  std::vector<Cached> cached_;
  uint64_t next_id_ = 1, clock_ = 0;
  EngineStats stats_;
};

} // namespace offgraph::engine
