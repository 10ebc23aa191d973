// Engine: the step loop that serves many requests on one model. Each step batches every active
// request's next decode token and prefill chunks (at most max_write tokens each) under a per-step
// token budget, runs one forward pass, samples, and streams tokens. New requests join between
// steps; finished or cancelled ones leave at once.
//
// Prefix reuse: a finished request's sequence stays cached, and every prompt end a request reached
// keeps a ring snapshot, all in one prefix tree (engine/prefix_tree.h). A new request starts as a
// fork of the deepest reusable point at or before its divergence: a cached sequence whose rings
// still hold that point, else the deepest snapshot on its path (pages shared from a cached
// sequence below it). Cached sequences are never taken: any number of requests continue one at
// once. This is what makes agent loops, regenerations, edits and fan-outs cheap on
// sliding-window models.
#pragma once

#include "base/status.h"
#include "engine/prefix_tree.h"
#include "engine/speculation.h"
#include "kv/kv_store.h"
#include "model/forward.h"
#include "model/vision_encoder.h"
#include "sample/grammar_matcher.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"
#include "sample/speculative.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <vector>

namespace offgraph::engine {

struct EngineOptions {
  int32_t context = 4096;  // per sequence: prompt + generated tokens
  int32_t max_write = 256; // largest prefill chunk
  int32_t page_rows = 64;  // rows of a page of flat KV storage (cache::Policy)
  // Positions a sliding layer's ring keeps past its window (cache::Policy::ring_reach): the most
  // a rewind, a rejected draft or a snapshot's reach goes back once the ring wrapped.
  int32_t ring_reach = cache::Policy{}.ring_reach;
  int32_t step_tokens = 512; // token budget of one step (decodes first, then prefill chunks)
  int32_t max_active = 8;    // requests computed together
  int32_t max_cached = 8;    // finished sequences kept for prefix reuse
  // Also snapshot every N prompt tokens (0: only at prompt ends): a branch inside a long prompt
  // then recomputes at most N tokens. And at the end of each prefill chunk within snapshot_reach
  // of a message start (Request::message_starts), reaching back over it as far as the rings
  // hold: an edit within snapshot_reach of a message's start (either side) resumes exactly at the
  // edit where the chunk ends within the ring's lead of it, else from the chunk before. Each costs
  // window - 1 + its reach rows per sliding layer (a reach of at most the lead, ring_reach + 1).
  int32_t snapshot_every = 0;
  // Snapshots also resume up to this many tokens before the point they were taken at (each
  // costs that many rows more per sliding layer): a prompt's end then serves a next turn that
  // renders the prompt's generation header ("<|start|>assistant") as another role's message.
  int32_t snapshot_reach = 16;
  // Snapshots at message starts (the chunk-end ones above) also without snapshot_every: the
  // branch points of agent traffic (an edited tool result, a regenerated turn) resume at the
  // message, not at the prompt end before it. They and every other snapshot share
  // snapshot_budget.
  bool start_snapshots = true;
  // Bytes the snapshots inside prompts (message starts, snapshot_every) may hold together, the
  // least recently used dropped first (a prompt end's goes with its conversation): 0, the bytes
  // of one sequence the length of the context; -1: no limit.
  int64_t snapshot_budget = 0;
  bool prefix_reuse = true; // off: every prompt is computed from scratch (a reference)
  size_t max_queue = 64;    // waiting requests; more are refused
  // Bytes of KV storage (sequences and snapshots) the engine may hold; 0: no limit;
  // kKvBudgetFromMemory: kv_budget_from_memory() of every device holding KV. A request is admitted
  // only when the most it can grow to fits beside what the active ones may grow to; until then it
  // waits in the queue (one that can never fit is refused at submit). Cached conversations make
  // room, least recently used first.
  static constexpr int64_t kKvBudgetFromMemory = -1;
  int64_t kv_budget = 0;
  // Bytes each device's compute buffers (both models' forward passes together) may hold; 0: no
  // limit; kComputeBudgetFromMemory: compute_budget_from_memory() of each device. A step whose
  // graph needs more runs smaller (model::Forward::set_compute_limit; the engine's fallbacks for
  // graphs that cannot be allocated). At create the engine measures a one-token step at the
  // deepest position of the context (with the draft model's, if any): a budget that cannot hold
  // it is refused, so every request fits one token a step. The draft's passes leave the
  // target's one-token step its room (a draft that finds none is not started).
  static constexpr int64_t kComputeBudgetFromMemory = -1;
  int64_t compute_budget = 0;
  // Bytes the cached conversations may hold together; 0: limited only by max_cached.
  int64_t cache_budget = 0;
  // Bytes of free KV pages whose memory stays with the process for the next burst to reuse; the
  // rest is given back to the OS after each step (kv::KvStore::release_free_memory), and the
  // allocator's free memory (ring and snapshot buffers) when the engine falls idle: the
  // process's resident memory after a burst returns to what it holds.
  int64_t warm_free_kv = int64_t(64) << 20;
  // Fault injection for tests (kv::KvStore::set_fault): an error it returns fails that call of
  // the engine's store (a step's reserve, a fork, a fork at a snapshot, a new sequence, a
  // snapshot).
  kv::KvStore::Fault kv_fault;
  // Fault injection for tests (model::Forward::set_allocation_fault): true fails the allocation
  // of that batch's graph (the target model's), as if a device's memory could not be had.
  model::Forward::AllocationFault allocation_fault;
  // Fault injection for tests: true (for a request's id) fails the host allocation of that
  // request's next sampling step (std::bad_alloc), as if its grammar tables or logits could not
  // be had.
  std::function<bool(uint64_t request)> sampling_fault;
  // Fault injection for tests: kv_fault and allocation_fault for the draft model's store and
  // graphs. A draft that fails is not used: speculation slows, answers stay the same.
  kv::KvStore::Fault draft_kv_fault;
  model::Forward::AllocationFault draft_allocation_fault;
  // Fault injection for tests: true (given the steps run so far) throws std::bad_alloc from the
  // step's own bookkeeping after its batch ran, as memory that no fault site contains.
  std::function<bool(int64_t steps)> step_fault;
  kv::StorageTypes types;
  int threads = 2;
  // Speculative decoding for requests that do not choose their own (Request::speculation).
  SpeculationOptions speculation;
  // The drafter of DraftSource::Draft: a model with the target's vocabulary (the caller checks
  // the token texts; the engine, their count), run with a KV store of its own. Not owned.
  const model::Model *draft_model = nullptr;
};

// What one device (a buffer type of the KV store) brings to the KV budget: the memory it may still
// take (`available`: the host's model::available_memory() once the weights are in, another
// device's free memory; 0: unknown), the store's memory already allocated there (`held`: a
// device's page pool, allocated in full), and the largest part of the store's bytes it can
// hold (`part`, 0..1: its caches' share of a sequence's rings alone, or of a sequence at the full
// context, whichever is larger; what any mix of lengths and snapshots puts there is between).
struct KvDeviceMemory {
  int64_t available = 0, held = 0;
  double part = 0;
};
// The KV budget EngineOptions::kKvBudgetFromMemory stands for: the largest total whose part on
// each device fits in what the store holds there plus three quarters of what the device may
// still take; at most what the store can hold (`pool`: its page pool, and the rings and snapshots
// beside it), and at least what one request at the full context holds (`one`: a budget that cannot
// hold it would refuse what the context allows). A quarter of each device stays for the rest:
// compute buffers (an eighth by default: compute_budget_from_memory), images, grammar tables and
// the process. A device whose memory is unknown sets no limit; 0 (no limit) where none is known.
int64_t kv_budget_from_memory(std::span<const KvDeviceMemory> devices, int64_t pool, int64_t one);
// One device, the host, holding all of it.
inline int64_t kv_budget_from_memory(int64_t available, int64_t pool, int64_t one) {
  const KvDeviceMemory host{available, 0, 1.0};
  return kv_budget_from_memory(std::span(&host, 1), pool, one);
}

// The compute budget EngineOptions::kComputeBudgetFromMemory stands for on one device: an eighth
// of what it may still take at start (`available`; the KV budget takes three quarters, the rest
// stays for images, grammar tables and the process), at least what a one-token step at the full
// context needs there (`one_token`); 0 (no limit) where the memory is unknown.
int64_t compute_budget_from_memory(int64_t available, int64_t one_token);

enum class FinishReason { None, Stop, Length, Cancelled, Error };

struct Request {
  std::vector<int32_t> prompt;
  sample::SamplingParams sampling;
  int32_t max_tokens = 256;         // 0: the prompt only (scored with prompt_logprobs)
  std::vector<int32_t> stop_tokens; // end-of-turn ids (never <|eom|>)
  // Choices: the prompt is computed once and its cache forked into n sequences; choice i samples
  // with seed + i.
  int32_t n = 1;
  // Prompt positions where a message's own text begins, ascending (text::ChatTokens): the
  // branch points of edited messages, which snapshots reach back over (snapshot_every).
  std::vector<int32_t> message_starts;
  // Log-probabilities (sample/logprobs.h: the model's, before any sampling step). -1: none; k in
  // [0, 20]: each generated token's with the k most likely.
  int32_t top_logprobs = -1;
  // Each prompt token's log-probability after the tokens before it (from the second on, with
  // top_logprobs of them, at least 0): the prompt is then computed whole, never reused, since a
  // reused position has no logits.
  bool prompt_logprobs = false;
  // Constrained output (response_format, strict tools, tool_choice, a grammar): every sampled
  // token is one the grammar allows, and the end tokens it names are allowed only where the
  // grammar is complete. Each choice walks it on its own. Null: free.
  std::shared_ptr<const sample::CompiledGrammar> grammar;
  // Speculative decoding for this request; none: the engine's (EngineOptions::speculation).
  std::optional<SpeculationOptions> speculation;
  // Tokens the answer is expected to repeat (OpenAI's Predicted Outputs): the n-gram drafter
  // drafts from them as from the context (they never enter the context). A request with a
  // prediction speculates with n-gram drafts even where its options say none.
  std::vector<int32_t> prediction;
  // An event without a token or a finish once the request is admitted, carrying cached_tokens
  // (the prefix it reuses): what an API that reports the cache before the answer's first token
  // (Anthropic's message_start) waits for.
  bool report_admission = false;
  // Embedding rows in the prompt (images, placed by engine/images.h): prompt[at, at + n_rows)
  // take these rows in place of token embeddings, ascending and disjoint. The prompt's ids there
  // are not looked up: they key the rows for prefix reuse (image_row_ids), so two different
  // images must not share them. Reuse ends at an image's first row unless all its rows match.
  // Such a request neither scores its prompt (prompt_logprobs) nor drafts with a draft model
  // (neither can take an image row); n-gram drafts stop before any id outside the vocabulary.
  struct Embeddings {
    int32_t at = 0;
    std::shared_ptr<const model::EncodedImage> rows;
  };
  std::vector<Embeddings> embeddings;
};

// A request's sampling when it sets none: the generic defaults (sample::SamplingParams) with the
// values the model's architecture recommends in their place.
sample::SamplingParams default_sampling(const model::Model &model);

struct Event {
  uint64_t request = 0;
  int32_t token = -1;                       // a generated token, or -1 when only finishing
  FinishReason finish = FinishReason::None; // set on the request's last event
  std::string error;                        // with FinishReason::Error
  int32_t cached_tokens = 0; // prompt tokens reused, not computed (admission, token, last events)
  int32_t choice = 0;        // which of the request's n choices
  // With Request::top_logprobs >= 0, on a token's event: that token's.
  std::optional<sample::TokenLogprobs> logprobs;
  // With Request::prompt_logprobs, on each choice's first event: one per prompt token after the
  // first.
  std::shared_ptr<const std::vector<sample::TokenLogprobs>> prompt_logprobs;
  // On the last event: this choice's drafted tokens that were verified, and of those the ones kept.
  int32_t drafted = 0, accepted = 0;
};

// Speculative decoding by one draft source: verify spans run, drafted tokens they verified, and
// of those the ones kept. Tokens per target step: (accepted + verifications) / verifications.
struct DraftStats {
  int64_t verifications = 0, drafted = 0, accepted = 0;
  // kept[j]: verifications that kept exactly j drafted tokens (the first rejection at j + 1).
  std::array<int64_t, kMaxDraftTokens + 1> kept = {};
};

struct EngineStats {
  int64_t steps = 0, prompt_tokens = 0, computed_prompt_tokens = 0, reused_prompt_tokens = 0,
          generated_tokens = 0, snapshot_restores = 0;
  int64_t prefix_hits = 0;        // requests that reused at least one cached token
  int64_t cache_evictions = 0;    // cached conversations dropped (count, bytes, memory)
  int64_t snapshot_evictions = 0; // snapshots dropped (budget, or their last sequence went)
  int64_t parked = 0;             // requests that waited for another to compute a shared prefix
  int64_t waits_for_memory = 0;   // steps in which the queue's head waited for KV memory
  int64_t failed_forks = 0;       // forks for prefix reuse that could not be made (fell back)
  int64_t step_memory_faults = 0; // steps whose requests all ended: std::bad_alloc no site held
  // Graphs (of both models) refused for needing more than the compute budget: their steps ran
  // smaller.
  int64_t compute_budget_refusals = 0;
  // Last events whose receiver could not take them (std::bad_alloc from its callback, again at
  // each of the next steps, or not even kept for them): their requests ended without the
  // receiver knowing.
  int64_t lost_end_events = 0;
  // The most rows of logits one step computed (scored prompts take at most 64 a step together).
  int64_t peak_step_logit_rows = 0;
  // Time of the forward passes, split between prompt and generated tokens by their share of
  // each step's tokens.
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t decode_spans = 0;          // a sequence's decode in one step: one token, or a verify span
  DraftStats ngram;                  // speculative decoding with n-gram drafts
  DraftStats draft;                  // and with the draft model's
  int64_t draft_steps = 0;           // forward passes of the draft model
  int64_t draft_catch_up_tokens = 0; // tokens the draft model computed to catch up
  double draft_seconds = 0;          // their time (also counted in decode_seconds)
};

class Engine {
public:
  static Result<std::unique_ptr<Engine>> create(const model::Model &model, EngineOptions options);

  // Threads: submit(), cancel(), cancel_all(), queued(), load() and published_stats() may be
  // called from any thread, at any time (also from event callbacks); everything else belongs to
  // the thread that calls step(). Requests and cancellations take effect at the next step.

  // Queues a request; events go to `on_event` from step(). Refused up front, with the numbers,
  // when prompt + max_tokens cannot fit the context or the queue is full.
  Result<uint64_t> submit(Request request, std::function<void(const Event &)> on_event);
  // The request (or only its choice `choice`) ends with FinishReason::Cancelled at the next step;
  // its sequence is freed then.
  void cancel(uint64_t id, int32_t choice = -1);
  // Every queued and active request (shutdown).
  void cancel_all();
  // One step. False when there was nothing to do.
  bool step();
  // Steps until every request has finished.
  void run_until_idle();

  const EngineStats &stats() const { return stats_; }
  size_t active() const { return active_.size(); }
  // Requests submitted and not yet started (or refused).
  size_t queued() const { return waiting_; }
  // As of the end of the last step, for other threads.
  struct Load {
    size_t active = 0, queued = 0, cached = 0;
    int64_t cached_bytes = 0;
    size_t tree_nodes = 0, snapshots = 0;
    // Against the memory budgets (docs/reliability.md, "Budgets"): what counts against kv_budget
    // (kv::KvStore::bytes_in_use), the snapshots inside prompts and their budget (-1: none), and
    // the draft model's store and its budget (0: none; the KV budget's share).
    int64_t kv_in_use = 0, snapshot_bytes = 0, snapshot_budget = 0, draft_kv = 0,
            draft_kv_budget = 0;
    // The ledger by device, by the buffer type the bytes live in (named where they are read:
    // model::Devices::name_of): the KV store's bytes in use ("kv"), the draft model's
    // ("draft_kv"), and the compute buffers of both models' forward passes ("compute").
    struct DeviceBytes {
      ggml_backend_buffer_type_t buft = nullptr;
      const char *use = "";
      int64_t bytes = 0;
    };
    std::vector<DeviceBytes> by_device;
  };
  Load load() const;
  // The most of the KV budget each device can hold (KvDeviceMemory::part of it: "kv"; none
  // without a budget), of the draft's likewise ("draft_kv"), and each device's compute budget
  // ("compute"). Fixed at create: safe from any thread.
  const std::vector<Load::DeviceBytes> &budget_by_device() const { return budget_by_device_; }
  // What the compute budget was measured against at create, by device (none without a budget):
  // one token's step and a full prefill chunk (max_write tokens, at most step_tokens), each at
  // the deepest position of the context, both models together.
  struct ComputeNeeds {
    kv::BytesByBufferType one_token, full_chunk;
  };
  const ComputeNeeds &compute_needs() const { return compute_needs_; }
  EngineStats published_stats() const;
  size_t cached() const { return cached_.size(); }
  // Last events kept for receivers that could not take them (offered again at the next steps;
  // the stepping thread's).
  size_t undelivered() const { return undelivered_.size(); }
  // Draft caches kept with cached conversations.
  size_t cached_drafts() const { return cached_drafts_.size(); }
  // Bytes held by the cached conversations and the snapshots: their rings, the pages no active
  // request holds (each once), snapshots and their logits.
  int64_t cached_bytes() const;
  // The same computed by walking every active and cached page table (O(pages)): the reference
  // tests hold cached_bytes to.
  int64_t cached_bytes_walked() const;
  // The most KV memory `request` can hold (every choice at its full length and the snapshots
  // its prompt keeps): what admission reserves for it under EngineOptions::kv_budget.
  int64_t peak_kv_bytes(const Request &request) const;
  // The most rows of logits a step can compute (one per token of the step, at most).
  int64_t max_step_logit_rows() const;
  const PrefixTree &tree() const { return tree_; }
  const EngineOptions &options() const { return options_; }
  const kv::KvStore &store() const { return *store_; }
  // The draft model's store (null without one).
  const kv::KvStore *draft_store() const { return draft_store_.get(); }

private:
  // A size of step (or of one generation's span) whose graph can be allocated, learned from
  // failures (a device's memory that stays short, the compute budget): a failure at T tokens caps
  // the next at T / 2; kRelax that ran at the cap double it, until it reaches the most there is
  // (no cap). 0: no cap.
  struct Allocatable {
    static constexpr int32_t kRelax = 32;
    int32_t tokens = 0, ran_at_cap = 0;
    void failed(int32_t t) {
      const int32_t half = std::max(1, t / 2);
      tokens = tokens > 0 ? std::min(tokens, half) : half, ran_at_cap = 0;
    }
    void ran(int32_t t, int32_t most) {
      if (tokens <= 0 || t < tokens || ++ran_at_cap < kRelax) return;
      tokens = tokens * 2 >= most ? 0 : tokens * 2, ran_at_cap = 0;
    }
    int32_t cap(int32_t n) const { return tokens > 0 ? std::min(n, tokens) : n; }
  };
  // One choice of one request, from the queue through the batch to its end: the request's first
  // choice is queued and admitted; its others are forked from it once the prompt is computed.
  struct Generation {
    uint64_t id = 0;
    Request request;
    std::function<void(const Event &)> on_event;
    std::optional<sample::Sampler> sampler;
    kv::SeqId seq = 0;
    std::vector<int32_t> tokens; // what the sequence holds, then the prompt's rest and picks
    size_t computed = 0;         // tokens[0, computed) are in the cache
    bool finishing = false;      // finish() has begun
    int32_t generated = 0;
    bool cancelled = false;
    // A forward pass over the sequence failed: a ring may hold rows of positions it never
    // committed over ones it still claims (a deferred write runs inside the pass), so the
    // sequence is not cached for reuse.
    bool rows_unknown = false;
    int32_t reused = 0; // prompt tokens found in the cache
    int32_t choice = 0;
    // Snapshots taken along the prompt (periodic ones, the prompt end's with its logits), for the
    // tree when this generation's sequence is cached.
    struct Taken {
      int32_t depth;
      std::unique_ptr<kv::Snapshot> snapshot;
      std::vector<float> logits;
    };
    std::vector<Taken> taken;
    std::optional<sample::GrammarMatcher> grammar;
    // Speculative decoding: its drafter follows `tokens` (every kept token is appended).
    std::optional<Speculator> speculator;
    // DraftSource::Draft: its sequence in the draft model's store (-1: none yet), which holds
    // tokens[0, draft_len).
    kv::SeqId draft_seq = -1;
    size_t draft_len = 0;
    // Speculative sampling: the draft model's sampler (a stream of its own) and the distribution
    // q each token of the current draft was drawn from.
    std::optional<sample::Sampler> draft_sampler;
    std::vector<std::vector<double>> draft_q; // the first draft_q_used rows (kept for reuse)
    size_t draft_q_used = 0;
    int32_t drafted = 0, accepted = 0;      // by its verifications (Event::drafted, accepted)
    int32_t span_tested = 0, span_kept = 0; // of the verification being sampled (advance)
    // Choices 1.. below this were started (or ended) on their own; end_events ends the rest with
    // choice 0, so that each choice sees exactly one last event.
    int32_t choices_started = 1;
    // Depths of its prompt where requests wait to share what it computes (in-flight sharing):
    // its prefill stops there, and the state is cached for them (a fork) and kept (a snapshot).
    std::set<int32_t> publish_at;
    // logits_ready: the whole prompt came back from a snapshot with its logits, and the first
    // token is sampled from these without a forward pass.
    std::vector<float> prompt_logits;
    bool logits_ready = false;
    // Request::prompt_logprobs: gathered during prefill, sent with each choice's first event.
    std::shared_ptr<std::vector<sample::TokenLogprobs>> prompt_logprobs;
    bool prompt_logprobs_sent = false;
    // The message start the last chunks snapshotted near, and how many did.
    int32_t near_start = -1, near_start_snapshots = 0;
    // Its own span size that can be allocated (a prompt chunk or a verify span that failed
    // alone: its depth, not the step, was too much), so that the next ones do not fail first.
    Allocatable span;
  };
  // A request waiting for an active one to compute the prefix they share.
  struct Parked {
    std::unique_ptr<Generation> g;
    uint64_t waits_for; // the active request's id (its first choice)
    int32_t depth;      // how much of its prompt that one will have computed for this one
  };
  // A snapshot in the tree, with the logits at its depth when that was a prompt's end.
  struct Saved {
    std::unique_ptr<kv::Snapshot> snapshot;
    std::vector<float> logits;
    uint64_t last_used = 0;
  };

  Engine(const model::Model &model, EngineOptions options) : model_(model), options_(options) {}
  // A step's work to the batch: `n` tokens of `g` (a decode token or a prefill chunk).
  struct Part {
    Generation *g;
    int32_t n;
    bool wants_logits; // the last token's (a decode, or a prompt's end)
    bool all_rows;     // every token's (a prompt scored with prompt_logprobs)
    // A decode's drafted tokens, verified after its token (n = 1 + draft.size(); every row's
    // logits are read).
    std::vector<int32_t> draft = {};
  };
  // step()'s phases, in order; each says whether it did anything.
  bool step_inner();
  // What step() does when std::bad_alloc escapes step_inner: the step's requests end.
  void end_step_out_of_memory();
  void drop_cancelled();
  void admit_queued();
  bool sample_restored_prompts(); // prompts that came back whole, with their logits
  std::vector<Part> plan_batch(); // each generation's next tokens under the step budget
  void run_batch(const std::vector<Part> &parts);
  // Removes the generations in `gone` from active_ and adds born_ (forked choices).
  void settle(const std::vector<Generation *> &gone);
  // Moves submitted requests into the queue and applies cancellations.
  void take_inbox();
  void publish();
  // Gives free memory back to the OS (EngineOptions::warm_free_kv).
  void give_back_memory();
  Status admit(Generation &a);
  // Starts `a` from the deepest reusable point the tree holds; false when there is none.
  bool attach(Generation &a);
  // Whether `a` should wait for an active request that is computing a longer shared prefix than
  // the tree holds; if so, that one is told to publish it and `a` is parked.
  bool park(std::unique_ptr<Generation> &a);
  // Parked requests whose prefix is ready (or whose producer is gone) go back to the queue.
  void unpark();
  // After a step: the shared prefix `a` was to publish at its current length, if any (true).
  bool publish_prefix(Generation &a);
  // Caches a's sequence (with its snapshots) in the tree; false when it was not kept.
  bool cache_sequence(Generation &a);
  void free_snapshots(const std::vector<PrefixTree::SnapshotId> &ids);
  // EngineOptions::snapshot_budget resolved (-1: none), and what the snapshots inside prompts
  // hold.
  int64_t snapshot_budget() const;
  int64_t snapshot_bytes() const;
  // The tree's snapshots inside prompts evicted until `reserve` more bytes fit the budget.
  void evict_over_budget_minus(int64_t reserve);
  // A request's own snapshots inside its prompt kept within the budget, as they are taken.
  void trim_taken(Generation &a);
  // Drops a cached sequence, with the snapshots no other sequence passes through.
  void drop_cached(kv::SeqId s);
  // Puts a snapshot taken after `prefix` into the tree. Of two at one depth the one reaching
  // further back stays, with a prompt end's logits; dropped when no cached sequence passes
  // through `prefix`.
  void keep_snapshot(std::span<const int32_t> prefix, std::unique_ptr<kv::Snapshot> snapshot,
                     std::vector<float> logits);
  // Whether `a` may start now under the memory budget (dropping cached conversations for room);
  // an error when it could never fit.
  Result<bool> memory_allows(const Generation &a);
  int64_t peak_bytes(const Generation &a) const;
  // With `shared_points` snapshots where queued requests wait to share its prefix.
  int64_t peak_bytes(const Request &r, size_t shared_points) const;
  // Refuses `need` bytes past the KV budget, naming it.
  Status check_kv_budget(const Request &r, int64_t need) const;
  // The least recently used cached sequence or snapshot (or sequence only).
  void evict_lru(bool sequences_only = false);
  void evict_over_budget();
  // Ends a generation; `keep`: its sequence may stay cached for prefix reuse.
  void finish(Generation &a, FinishReason reason, const std::string &error = {}, bool keep = true);
  // The last event of a (and of its choices not forked yet).
  void end_events(Generation &a, FinishReason reason, const std::string &error = "");
  // A last event through `on_event`; one whose receiver throws std::bad_alloc is kept for the
  // next steps (undelivered_), never lost with the rest of the step.
  void send_end(const std::function<void(const Event &)> &on_event, const Event &e);
  // Sends the kept last events, in order, each once a step; one refused kEndTries times goes
  // (EngineStats::lost_end_events).
  void send_undelivered();
  static constexpr int32_t kEndTries = 16;
  struct Undelivered {
    std::function<void(const Event &)> on_event;
    Event event;
    int32_t tries = 0;
  };
  std::list<Undelivered> undelivered_;
  // A scored prompt's log-probabilities go with each choice's first event.
  static void attach_prompt_logprobs(Generation &a, Event &e);
  // The first of a's message starts in [from - snapshot_reach, to + snapshot_reach], or -1: a
  // chunk [from, to) near one ends with a snapshot reaching back over it.
  int32_t message_start_near(const Generation &a, size_t from, size_t to) const;
  // Samples a's next token from `logits` and streams it; false once a is finished.
  // `drawn`, when given, gets the token sampled (also when that token finished a); `drafted`,
  // when not -1, is the drafted token at this position, compared with it for the counts the last
  // event reports.
  // `chosen`, when not -1, is emitted instead of a token sampled (speculative sampling decided it).
  // Memory that cannot be had for one request's sampling (its grammar's tables, its logits'
  // copies, its log-probabilities: std::bad_alloc) ends that request alone.
  bool advance(Generation &a, std::span<const float> logits, int32_t *drawn = nullptr,
               int32_t drafted = -1, int32_t chosen = -1);
  bool advance_unguarded(Generation &a, std::span<const float> logits, int32_t *drawn,
                         int32_t drafted, int32_t chosen);
  // Whether a's drafts are sampled from the draft model's q and verified by speculative sampling
  // (p/q): a sampled request drafted by a draft model with SpeculationOptions::pq, no grammar.
  bool speculative_sampling(const Generation &a) const;
  // Speculative sampling's verdict on a draft: p from each row through a's sampler, q kept when
  // the draft was drawn (Generation::draft_q).
  Result<sample::SpeculativeVerdict> pq_verdict(Generation &a, const float *rows,
                                                const std::vector<int32_t> &draft);
  // A drafted token drawn from the draft model's distribution q for a (kept in a.draft_q), after
  // the tokens `drafted` before it; -1 when nothing can be drawn.
  int32_t draw_draft(Generation &a, std::span<const float> row,
                     const std::vector<int32_t> &drafted);
  // After a verify span: samples its rows in turn (advance), keeping drafted tokens while each
  // equals the token drawn, then rewinds the sequence past what was kept. False once a is
  // finished.
  bool verify(Generation &a, const float *rows, const std::vector<int32_t> &draft);
  // Rewinds a's sequence to a.computed when a verify span left rows past it (the rejected
  // drafts); an error, changing nothing, where the rings no longer hold the window there.
  Status drop_rejected(Generation &a);
  // How much of a's prompt a prefix of `shared` matching tokens lets it reuse: a match ending
  // inside an image's rows stops at the image's first row (row ids are 31-bit draws, so only an
  // image's rows matching whole identify it).
  static int32_t reusable_depth(const Generation &a, int32_t shared);
  // Starts a's drafter over its tokens when its request speculates.
  void start_speculation(Generation &a);
  // The draft model's greedy continuations: `want[i].second` tokens after each generation's
  // tokens, its draft cache first brought up to them (in max_write chunks), every generation's
  // step batched. A failure drafts nothing for any (the step then decodes one token each).
  std::vector<std::vector<int32_t>>
  draft_with_model(const std::vector<std::pair<Generation *, int32_t>> &want);
  // After a verification: the draft cache cut back to what a's tokens still hold.
  void sync_draft(Generation &a);
  void drop_draft(Generation &a);
  // Prefix reuse in the draft store: a's draft cache starts as a fork of the one kept with the
  // cached sequence `from`, at `depth` (or what it holds, if less), where its rings allow.
  void reuse_draft(Generation &a, kv::SeqId from, int32_t depth);
  // The other n - 1 choices of a request whose prompt was just computed, forked from it into
  // born_; a choice that cannot be started (its fork, its memory) ends with an error, the others
  // go on.
  void spawn_choices(Generation &a, std::span<const float> logits);
  // Choice c of them, forked and ready to sample, or why not; throws std::bad_alloc holding no
  // sequence.
  Result<std::unique_ptr<Generation>> start_choice(Generation &a, int32_t c);

  const model::Model &model_;
  EngineOptions options_;
  std::unique_ptr<kv::KvStore> store_;
  std::unique_ptr<model::Forward> forward_;
  // The draft model's store and forward pass (EngineOptions::draft_model).
  std::unique_ptr<kv::KvStore> draft_store_;
  bool trimmed_while_idle_ = false; // malloc_trim ran since the engine last had work
  std::unique_ptr<model::Forward> draft_forward_;
  double draft_step_seconds_ = 0; // recent mean time of one draft forward pass
  // Draft caches kept with cached sequences (by the target's sequence id): id and tokens held.
  std::map<kv::SeqId, std::pair<kv::SeqId, size_t>> cached_drafts_;
  // Of the steps (Allocatable).
  Allocatable allocatable_;
  // budget_by_device(): fixed once the budgets are.
  std::vector<Load::DeviceBytes> budget_by_device_;
  ComputeNeeds compute_needs_;
  // Measures compute_needs_ and sets each forward pass's compute limit (EngineOptions::
  // compute_budget); refuses a budget that cannot hold a one-token step.
  Status set_compute_budget();
  std::deque<std::unique_ptr<Generation>> queue_;
  std::vector<Parked> parked_;
  std::vector<std::unique_ptr<Generation>> active_;
  // Choices forked during this step, joining active_ when it settles.
  std::vector<std::unique_ptr<Generation>> born_;
  PrefixTree tree_;
  // A cached sequence: when it was last used, and how many of its tokens were its prompt (the
  // rest it generated).
  struct Cached {
    uint64_t last_used = 0;
    int32_t prompt = 0;
    uint64_t request = 0; // the request it answered (0: a published prefix)
  };
  std::map<kv::SeqId, Cached> cached_;
  std::map<PrefixTree::SnapshotId, Saved> saved_;
  PrefixTree::SnapshotId next_snapshot_ = 0;
  uint64_t next_id_ = 1, clock_ = 0;
  EngineStats stats_;

  // What other threads hand in (under inbox_mutex_) and read (under published_mutex_).
  std::mutex inbox_mutex_;
  std::deque<std::unique_ptr<Generation>> inbox_;
  std::vector<std::pair<uint64_t, int32_t>> cancels_;
  // pq_verdict's p rows, reused across steps (vocabulary-sized each).
  std::vector<std::vector<double>> pq_scratch_;
  // The cost of a decode step by its token count, and the acceptance rate of recent verifications
  // over every sequence (a new sequence's prior), for the adaptive draft length.
  StepCost step_cost_;
  // By draft source (DraftSource's order).
  std::array<Acceptance, 3> recent_acceptance_{
      {Acceptance{0.5, 0.99}, Acceptance{0.5, 0.99}, Acceptance{0.5, 0.99}}};
  // advance()'s copy of a constrained choice's logits, kept so that no step allocates one.
  std::vector<float> masked_logits_;
  bool cancel_all_ = false;
  std::atomic<size_t> waiting_{0}; // inbox_ + queue_
  mutable std::mutex published_mutex_;
  Load published_;
  EngineStats published_stats_;
};

} // namespace offgraph::engine
