#include "engine/engine.h"

#include "engine/engine_detail.h"
#include "model/arch.h"
#include "model/weight_memory.h"

#include "ggml-cpu.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <new>

namespace offgraph::engine {
namespace {

// Rows of scored prompts (Request::prompt_logprobs), whose every row of logits is read, in one
// step, all such requests together: 64 rows of Muse Glimmer's 202,048 logits are 52 MB.
constexpr size_t kScoredChunk = 64;

// The rows of `r`'s embeddings among prompt positions [from, from + n), appended to `batch`
// (whose index of position `from` is `first`).
void append_embedding_rows(const Request &r, size_t from, size_t n, int32_t first,
                           model::Batch &batch) {
  for (const Request::Embeddings &e : r.embeddings) {
    const size_t at = size_t(e.at), width = size_t(e.rows->width);
    const size_t lo = std::max(from, at), hi = std::min(from + n, at + size_t(e.rows->n_rows));
    for (size_t p = lo; p < hi; ++p) {
      batch.embedding_at.push_back(first + int32_t(p - from));
      const float *row = e.rows->rows.data() + (p - at) * width;
      batch.embeddings.insert(batch.embeddings.end(), row, row + width);
    }
  }
}

// The request's embeddings well-formed (ascending, disjoint, inside the prompt, of the model's
// width) and its other ids tokens of the vocabulary.
Status check_prompt_inputs(const Request &r, const model::ModelConfig &c) {
  size_t end = 0, next = 0; // the last span's end; the next id to check
  auto check_tokens = [&](size_t to) -> Status {
    for (; next < to; ++next)
      if (r.prompt[next] < 0 || r.prompt[next] >= c.n_vocab)
        return Status::error("prompt token " + std::to_string(next) + " is " +
                             std::to_string(r.prompt[next]) + ", outside the vocabulary of " +
                             std::to_string(c.n_vocab));
    return Status();
  };
  for (const Request::Embeddings &e : r.embeddings) {
    if (!e.rows || e.rows->n_rows < 1 || e.rows->width != c.n_embd ||
        e.rows->rows.size() != size_t(e.rows->n_rows) * size_t(e.rows->width))
      return Status::error("prompt embeddings must hold rows of the model's width (" +
                           std::to_string(c.n_embd) + ")");
    if (e.at < 0 || size_t(e.at) < end || size_t(e.at) + size_t(e.rows->n_rows) > r.prompt.size())
      return Status::error("prompt embeddings must be ascending, disjoint and inside the prompt");
    if (Status s = check_tokens(size_t(e.at)); !s.ok()) return s;
    end = next = size_t(e.at) + size_t(e.rows->n_rows);
  }
  if (Status s = check_tokens(r.prompt.size()); !s.ok()) return s;
  if (r.embeddings.empty()) return Status();
  if (r.prompt_logprobs)
    return Status::error("prompt_logprobs: an image's rows are not tokens and have no "
                         "log-probability; a prompt with images cannot be scored");
  if (r.speculation && r.speculation->source == DraftSource::Draft)
    return Status::error("speculative decoding with a draft model cannot take a prompt with "
                         "images (the draft model has no image rows)");
  return Status();
}

} // namespace

Result<std::unique_ptr<Engine>> Engine::create(const model::Model &model, EngineOptions options) {
  if (options.context < 2 || options.max_write < 1 || options.step_tokens < 1 ||
      options.max_active < 1 || options.max_cached < 0 || options.snapshot_every < 0 ||
      options.snapshot_reach < 0 || options.page_rows < 1 ||
      options.kv_budget < EngineOptions::kKvBudgetFromMemory)
    return Status::error("engine: context >= 2, max_write, step_tokens, max_active and page_rows "
                         ">= 1, max_cached, snapshot_every and snapshot_reach >= 0, kv_budget >= "
                         "-1 (from memory)");
  options.max_write = std::min(options.max_write, options.context);
  if (Status s = validate(options.speculation); !s.ok()) return s;
  if (options.speculation.source != DraftSource::None && options.max_write < 2)
    return Status::error("speculative decoding verifies spans of at least 2 tokens; max_write (the "
                         "prefill chunk) is " +
                         std::to_string(options.max_write));
  std::unique_ptr<Engine> e(new Engine(model, options));
  auto layout = model::make_layout(
      model, {options.context, options.max_write, options.page_rows, options.ring_reach});
  if (!layout.ok()) return layout.status();
  // Flat caches on another device are allocated in full, not reserved as on the CPU: pages for
  // every active and cached sequence at full context, and no more.
  int32_t max_pages = 0;
  if (model.devices().size() > 1)
    max_pages = int32_t(std::min<int64_t>(
        int64_t(cache::PageTable::pages_for(options.context, (*layout)->page_rows())) *
            std::max(1, options.max_active + options.max_cached),
        std::numeric_limits<int32_t>::max()));
  auto store = kv::KvStore::create(*layout, options.types, model.cache_buffer_types(), max_pages);
  if (!store.ok()) return store.status();
  e->store_ = std::move(store).value();
  if (options.kv_fault) e->store_->set_fault(options.kv_fault);
  if (options.kv_budget == EngineOptions::kKvBudgetFromMemory)
    e->options_.kv_budget = kv_budget_from_memory(
        kv_device_memory(*e->store_, options.context),
        int64_t(e->store_->pages().max_pages()) * e->store_->page_bytes(),
        e->store_->peak_bytes_at_length(options.context) + e->store_->peak_bytes_at_length(0));
  e->store_->set_memory_budget(e->options_.kv_budget);
  e->forward_ = std::make_unique<model::Forward>(model, *e->store_, options.threads);
  if (options.allocation_fault) e->forward_->set_allocation_fault(options.allocation_fault);
  if (const model::Model *d = options.draft_model) {
    if (d->config().n_vocab != model.config().n_vocab)
      return Status::error("the draft model has " + std::to_string(d->config().n_vocab) +
                           " tokens; the model has " + std::to_string(model.config().n_vocab) +
                           " (a draft must share the vocabulary)");
    auto draft_layout = model::make_layout(
        *d, {options.context, options.max_write, options.page_rows, options.ring_reach});
    if (!draft_layout.ok()) return draft_layout.status();
    auto draft_store = kv::KvStore::create(*draft_layout, options.types, d->cache_buffer_types());
    if (!draft_store.ok()) return draft_store.status();
    e->draft_store_ = std::move(draft_store).value();
    // The draft's caches follow the target's sequences: its budget is the KV budget's share in
    // proportion to one full-context sequence of each. Past it a draft is not started (or cached
    // drafts go first): speculation slows, answers stay the same.
    if (const int64_t target = e->store_->peak_bytes_at_length(options.context);
        e->options_.kv_budget > 0 && target > 0)
      e->draft_store_->set_memory_budget(std::max<int64_t>(
          1, int64_t(double(e->options_.kv_budget) *
                     double(e->draft_store_->peak_bytes_at_length(options.context)) /
                     double(target))));
    if (options.draft_kv_fault) e->draft_store_->set_fault(options.draft_kv_fault);
    e->draft_forward_ = std::make_unique<model::Forward>(*d, *e->draft_store_, options.threads);
    if (options.draft_allocation_fault)
      e->draft_forward_->set_allocation_fault(options.draft_allocation_fault);
  } else if (options.speculation.source == DraftSource::Draft) {
    return Status::error("speculative decoding with a draft model needs one (a draft model file)");
  }
  e->kv_budget_by_device_ =
      budget_by_device(*e->store_, options.context, e->options_.kv_budget, "kv");
  if (e->draft_store_)
    for (const Load::DeviceBytes &d : budget_by_device(
             *e->draft_store_, options.context, e->draft_store_->memory_budget(), "draft_kv"))
      e->kv_budget_by_device_.push_back(d);
  return e;
}

Result<uint64_t> Engine::submit(Request request, std::function<void(const Event &)> on_event) {
  if (request.prompt.empty()) return Status::error("the prompt is empty");
  if (request.max_tokens < 0) return Status::error("max_tokens must not be negative");
  if (request.top_logprobs < -1 || request.top_logprobs > sample::kMaxTopLogprobs)
    return Status::error("top_logprobs must be between 0 and " +
                         std::to_string(sample::kMaxTopLogprobs));
  if (request.n < 1 || request.n > 16) return Status::error("n must be between 1 and 16");
  for (size_t i = 0; i < request.message_starts.size(); ++i)
    if (request.message_starts[i] < 0 ||
        size_t(request.message_starts[i]) >= request.prompt.size() ||
        (i > 0 && request.message_starts[i] <= request.message_starts[i - 1]))
      return Status::error("message starts must ascend inside the prompt");
  if (Status s = check_prompt_inputs(request, model_.config()); !s.ok()) return s;
  const int64_t need = int64_t(request.prompt.size()) + request.max_tokens;
  if (need > options_.context)
    return Status::error("the prompt has " + std::to_string(request.prompt.size()) +
                         " tokens and asks for up to " + std::to_string(request.max_tokens) +
                         " more, " + std::to_string(need) + " in all; the context holds " +
                         std::to_string(options_.context));
  // One that can never fit the KV budget is refused before it waits for it.
  if (Status s = check_kv_budget(request, peak_kv_bytes(request)); !s.ok()) return s;
  auto sampler = sample::Sampler::create(request.sampling, model_.config().n_vocab);
  if (!sampler.ok()) return sampler.status();
  if (request.speculation) {
    if (Status s = validate(*request.speculation); !s.ok()) return s;
    if (request.speculation->source == DraftSource::Draft && !draft_forward_)
      return Status::error("speculative decoding with a draft model: no draft model is loaded");
    if (request.speculation->source != DraftSource::None && options_.max_write < 2)
      return Status::error("speculative decoding verifies spans of at least 2 tokens; max_write "
                           "(the prefill chunk) is 1");
  }
  if (!request.prediction.empty() && request.speculation &&
      request.speculation->source != DraftSource::Ngram)
    return Status::error(std::string("a prediction is drafted from by n-gram drafts, but the "
                                     "request's speculation is ") +
                         draft_source_name(request.speculation->source));
  if (request.prediction.size() > size_t(options_.context))
    return Status::error("the prediction has " + std::to_string(request.prediction.size()) +
                         " tokens; at most the context, " + std::to_string(options_.context));
  for (int32_t t : request.prediction)
    if (t < 0 || t >= model_.config().n_vocab)
      return Status::error("the prediction holds token " + std::to_string(t) +
                           ", outside the vocabulary of " +
                           std::to_string(model_.config().n_vocab));
  if (request.grammar &&
      sample::grammar_vocabulary_size(*request.grammar) != size_t(model_.config().n_vocab))
    return Status::error("the grammar was compiled for a vocabulary of " +
                         std::to_string(sample::grammar_vocabulary_size(*request.grammar)) +
                         " tokens; the model has " + std::to_string(model_.config().n_vocab));
  auto a = std::make_unique<Generation>();
  if (request.grammar) a->grammar.emplace(request.grammar);
  a->request = std::move(request);
  a->on_event = std::move(on_event);
  a->sampler = std::move(sampler).value();
  if (a->request.prompt_logprobs)
    a->prompt_logprobs = std::make_shared<std::vector<sample::TokenLogprobs>>();
  std::lock_guard lock(inbox_mutex_);
  if (waiting_ >= options_.max_queue)
    return Status::error("the queue is full (" + std::to_string(options_.max_queue) +
                             " waiting requests)",
                         StatusCode::kResourceExhausted);
  a->id = next_id_++;
  const uint64_t id = a->id;
  inbox_.push_back(std::move(a));
  ++waiting_;
  return id;
}

void Engine::cancel(uint64_t id, int32_t choice) {
  std::lock_guard lock(inbox_mutex_);
  cancels_.push_back({id, choice});
}

void Engine::cancel_all() {
  std::lock_guard lock(inbox_mutex_);
  cancel_all_ = true;
}

void Engine::take_inbox() {
  std::lock_guard lock(inbox_mutex_);
  // One at a time: a push that cannot have its memory leaves the rest in the inbox, whole.
  while (!inbox_.empty()) {
    queue_.push_back(std::move(inbox_.front()));
    inbox_.pop_front();
  }
  for (const auto &[id, choice] : cancels_) {
    // A queued request has not forked its choices yet: cancelling one of them cancels it only
    // when it is the only one.
    for (auto &a : active_)
      if (a->id == id && (choice < 0 || a->choice == choice)) a->cancelled = true;
    for (auto &a : queue_)
      if (a->id == id && (choice < 0 || a->request.n == 1)) a->cancelled = true;
    for (auto &p : parked_)
      if (p.g->id == id && (choice < 0 || p.g->request.n == 1)) p.g->cancelled = true;
  }
  cancels_.clear();
  if (cancel_all_) {
    for (auto &a : active_) a->cancelled = true;
    for (auto &a : queue_) a->cancelled = true;
    for (auto &p : parked_) p.g->cancelled = true;
    cancel_all_ = false;
  }
}

int64_t Engine::max_step_logit_rows() const {
  // A row of logits is a row of the step's tokens: at most step_tokens, or one for each active
  // generation where they are more (a request's n choices are generations of their own).
  return std::max<int64_t>(options_.step_tokens, int64_t(options_.max_active) * 16);
}

void Engine::publish() {
  Load l;
  l.active = active_.size();
  l.queued = waiting_;
  l.cached = cached_.size();
  l.cached_bytes = cached_bytes();
  l.tree_nodes = tree_.n_nodes();
  l.snapshots = saved_.size();
  l.kv_in_use = store_->bytes_in_use();
  l.snapshot_bytes = snapshot_bytes();
  l.snapshot_budget = snapshot_budget();
  l.draft_kv = draft_store_ ? draft_store_->bytes_in_use() : 0;
  l.draft_kv_budget = draft_store_ ? draft_store_->memory_budget() : 0;
  auto add = [&l](const kv::BytesByBufferType &by, const char *use) {
    for (const auto &[buft, bytes] : by) l.by_device.push_back({buft, use, bytes});
  };
  add(store_->bytes_in_use_by_buffer_type(), "kv");
  if (draft_store_) add(draft_store_->bytes_in_use_by_buffer_type(), "draft_kv");
  kv::BytesByBufferType compute = forward_->compute_buffer_bytes();
  if (draft_forward_)
    for (const auto &[buft, bytes] : draft_forward_->compute_buffer_bytes())
      kv::add_bytes(compute, buft, bytes);
  add(compute, "compute");
  l.budget_by_device = kv_budget_by_device_;
  std::lock_guard lock(published_mutex_);
  published_ = l;
  published_stats_ = stats_;
}

Engine::Load Engine::load() const {
  std::lock_guard lock(published_mutex_);
  return published_;
}

EngineStats Engine::published_stats() const {
  std::lock_guard lock(published_mutex_);
  return published_stats_;
}

void Engine::attach_prompt_logprobs(Generation &a, Event &e) {
  if (!a.prompt_logprobs || a.prompt_logprobs_sent) return;
  e.prompt_logprobs = a.prompt_logprobs;
  a.prompt_logprobs_sent = true;
}

void Engine::end_events(Generation &a, FinishReason reason, const std::string &error) {
  Event e;
  e.request = a.id;
  e.finish = reason;
  e.error = error;
  e.cached_tokens = a.reused;
  e.choice = a.choice;
  // Inside a verification (advance() finishing a), its counts so far are a's too.
  e.drafted = a.drafted + a.span_tested, e.accepted = a.accepted + a.span_kept;
  attach_prompt_logprobs(a, e);
  if (!a.on_event) return;
  a.on_event(e);
  // Choices that were never forked end with their request, so that each choice of a request
  // sees exactly one last event.
  if (a.choice == 0)
    for (int32_t c = a.choices_started; c < a.request.n; ++c) {
      e.choice = c;
      a.on_event(e);
    }
}

void Engine::finish(Generation &a, FinishReason reason, const std::string &error, bool keep) {
  a.finishing = true;
  end_events(a, reason, error);
  // Keep what the sequence holds for prefix reuse; the least recently used goes first. Either
  // way the generation no longer owns it (it stays in active_ until the step settles). A verify
  // span's rejected rows go first; where they cannot, the sequence is not kept.
  const bool cached = keep && drop_rejected(a).ok() && cache_sequence(a);
  // A cached conversation keeps its draft cache (cut to the tokens it holds) for the requests
  // that continue it; anything else drops it.
  if (cached && a.draft_seq >= 0) {
    sync_draft(a);
    if (a.draft_seq >= 0) cached_drafts_[a.seq] = {a.draft_seq, a.draft_len};
    a.draft_seq = -1, a.draft_len = 0;
  }
  drop_draft(a);
  if (!cached) (void)store_->remove_sequence(a.seq);
  a.seq = -1;
  if (cached) evict_over_budget();
}

bool Engine::step() {
  bool worked = true;
  try {
    worked = step_inner();
  } catch (const std::bad_alloc &) {
    end_step_out_of_memory();
  }
  try {
    give_back_memory();
    publish();
  } catch (const std::bad_alloc &) {
    // Figures for other threads and memory handed back: next step's turn.
  }
  return worked;
}

void Engine::end_step_out_of_memory() {
  // std::bad_alloc that no site of the step contains (its own bookkeeping, a callback's): where
  // each active request stood is not known, so every one ends with the error, its sequence not
  // kept, and every sequence nothing holds goes back (a choice forked mid-step, say). Queued
  // requests and cached conversations stay; the engine goes on.
  ++stats_.step_memory_faults;
  const std::string why = "out of memory in the engine's step: every request of the step ended";
  // Choices forked this step are not in active_ yet: they end with the rest.
  for (auto &b : born_) active_.push_back(std::move(b));
  born_.clear();
  std::vector<Generation *> gone;
  for (const auto &g : active_) {
    gone.push_back(g.get());
    if (!g->finishing) {
      try {
        finish(*g, FinishReason::Error, why, /*keep=*/false);
        continue;
      } catch (const std::bad_alloc &) {
        // Its end could not be sent either: released below all the same.
      }
    }
    drop_draft(*g);
    if (g->seq >= 0 && !cached_.count(g->seq)) (void)store_->remove_sequence(g->seq);
    g->seq = -1;
  }
  settle(gone);
  // (Out of the prefix tree too: an id given out again must not serve this one's prefix.)
  for (kv::SeqId id : store_->sequence_ids())
    if (!cached_.count(id)) {
      free_snapshots(tree_.remove_sequence(id));
      (void)store_->remove_sequence(id);
    }
  if (draft_store_)
    for (kv::SeqId id : draft_store_->sequence_ids())
      if (std::none_of(cached_drafts_.begin(), cached_drafts_.end(),
                       [id](const auto &c) { return c.second.first == id; }))
        (void)draft_store_->remove_sequence(id);
}

void Engine::give_back_memory() {
  store_->release_free_memory(options_.warm_free_kv);
  if (draft_store_) draft_store_->release_free_memory(options_.warm_free_kv);
  // Ring and snapshot buffers come from malloc, which keeps what is freed for reuse: handed
  // back once a burst is over, not after every step (a trim walks the allocator's free lists).
  const bool idle = active_.empty() && queue_.empty() && parked_.empty();
  if (!idle) {
    trimmed_while_idle_ = false;
  } else if (!trimmed_while_idle_) {
    malloc_trim(0);
    trimmed_while_idle_ = true;
  }
}

bool Engine::step_inner() {
  take_inbox();
  drop_cancelled();
  admit_queued();
  const bool sampled = sample_restored_prompts();
  if (active_.empty()) return sampled;
  run_batch(plan_batch());
  return true;
}

void Engine::settle(const std::vector<Generation *> &gone) {
  std::erase_if(active_, [&](const auto &a) {
    return std::find(gone.begin(), gone.end(), a.get()) != gone.end();
  });
  active_.reserve(active_.size() + born_.size()); // what may throw, before any is moved
  for (auto &b : born_) active_.push_back(std::move(b));
  born_.clear();
}

// Cancelled requests leave first. Callbacks run after the containers are updated: they may
// submit or cancel.
void Engine::drop_cancelled() {
  std::vector<std::unique_ptr<Generation>> dropped;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->g->cancelled) {
      dropped.push_back(std::move(it->g));
      it = parked_.erase(it);
      --waiting_;
    } else {
      ++it;
    }
  }
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->cancelled) {
      dropped.push_back(std::move(*it));
      it = queue_.erase(it);
      --waiting_;
    } else {
      ++it;
    }
  }
  for (auto &a : dropped) end_events(*a, FinishReason::Cancelled);
  for (auto it = active_.begin(); it != active_.end();) {
    if ((*it)->cancelled) {
      finish(**it, FinishReason::Cancelled);
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
}

// Queued requests join while there is room.
void Engine::admit_queued() {
  unpark();
  while (int32_t(active_.size()) < options_.max_active && !queue_.empty()) {
    std::unique_ptr<Generation> a = std::move(queue_.front());
    queue_.pop_front();
    a->seq = -1;         // none yet: what a failure below releases
    bool in_line = true; // counted in waiting_
    try {
      // Waiting for another request to compute a shared prefix holds no memory: it parks before
      // any cached state is evicted to make room for it.
      if (park(a)) continue; // still waiting, beside the queue
      // First come, first served: the head waits for memory rather than being overtaken.
      auto fits = memory_allows(*a);
      if (fits.ok() && !*fits) {
        if (!active_.empty()) {
          queue_.push_front(std::move(a));
          ++stats_.waits_for_memory;
          break;
        }
        fits = Status::error("the KV memory budget cannot hold this request even alone");
      }
      --waiting_, in_line = false;
      if (!fits.ok()) {
        end_events(*a, FinishReason::Error, fits.message());
        continue;
      }
      if (Status s = admit(*a); !s.ok()) {
        end_events(*a, FinishReason::Error, s.message());
        continue;
      }
      stats_.prompt_tokens += int64_t(a->request.prompt.size());
      if (a->request.report_admission && a->on_event) {
        Event e;
        e.request = a->id, e.choice = a->choice, e.cached_tokens = a->reused;
        a->on_event(e);
      }
      active_.push_back(std::move(a));
    } catch (const std::bad_alloc &) {
      // Every hand-off above leaves `a` whole where it throws: this request ends here, holding
      // nothing; the others in line stay.
      if (!a) throw; // (not reached: a hand-off that threw kept it)
      if (in_line) --waiting_;
      drop_draft(*a);
      if (a->seq >= 0) (void)store_->remove_sequence(a->seq);
      a->seq = -1;
      end_events(*a, FinishReason::Error, "out of memory while admitting this request");
    }
  }
}

// Requests whose whole prompt came back with its logits take their first token now.
bool Engine::sample_restored_prompts() {
  bool sampled = false;
  std::vector<Generation *> done;
  for (auto &a : active_) {
    if (!a->logits_ready) continue;
    a->logits_ready = false;
    sampled = true;
    const std::vector<float> logits = a->prompt_logits;
    if (a->request.n > 1 && a->request.max_tokens > 0) spawn_choices(*a, logits);
    if (!advance(*a, logits)) done.push_back(a.get());
  }
  settle(done);
  return sampled;
}

int32_t Engine::message_start_near(const Generation &a, size_t from, size_t to) const {
  const std::vector<int32_t> &starts = a.request.message_starts;
  auto c = std::lower_bound(starts.begin(), starts.end(),
                            int32_t(from) - std::min(int32_t(from), options_.snapshot_reach));
  return c != starts.end() && size_t(*c) <= to + size_t(options_.snapshot_reach) ? *c : -1;
}

// The batch: each generation's next decode token or prefill chunk, in turn, under the budget.
// Generations take turns at the head of the line, so a budget smaller than the number of active
// ones delays each by a few steps instead of starving the last ones.
std::vector<Engine::Part> Engine::plan_batch() {
  std::vector<Generation *> order;
  const size_t start = size_t(stats_.steps) % active_.size();
  for (size_t i = 0; i < active_.size(); ++i)
    order.push_back(active_[(start + i) % active_.size()].get());
  std::vector<Part> parts;
  // Under a step size whose graph could not be allocated lately, smaller steps (allocatable_).
  int32_t budget = allocatable_.tokens > 0 ? std::min(options_.step_tokens, allocatable_.tokens)
                                           : options_.step_tokens;
  size_t scored_rows = 0; // within kScoredChunk a step
  // Drafts take only what leaves a token for every generation after them in this step's order.
  int32_t later = int32_t(order.size());
  // What drafted tokens add to a step of one token per active generation, measured; a draft
  // model's also costs one of its forward passes per drafted token. Only computed in a step where
  // some generation speculates (plain steps pay nothing for it).
  std::vector<double> draft_cost, model_cost;
  if (std::any_of(order.begin(), order.end(), [](const Generation *g) { return g->speculator; })) {
    draft_cost = step_cost_.relative(int32_t(order.size()), kMaxDraftTokens);
    model_cost = draft_cost;
    if (const auto step = step_cost_.seconds(int32_t(order.size()));
        step && draft_step_seconds_ > 0)
      for (size_t k = 1; k < model_cost.size(); ++k)
        model_cost[k] += double(k) * draft_step_seconds_ / *step;
  }
  std::vector<std::pair<Generation *, int32_t>> model_drafts; // drafted after planning
  std::vector<size_t> model_parts;
  for (Generation *a : order) {
    --later;
    if (budget <= 0) break;
    if (a->computed >= a->request.prompt.size()) {
      if (a->computed + 1 != a->tokens.size()) continue;
      Part decode{a, 1, true, false};
      if (a->speculator) {
        // Drafts no longer than a rejection can be rewound from, than the tokens the request may
        // still write after this step's first, and than the budget.
        const int32_t limit =
            std::min({store_->sequence(a->seq)->max_draft_tokens(),
                      a->request.max_tokens - a->generated - 1, budget - 1 - later});
        if (limit > 0 && a->speculator->options().source == DraftSource::Draft) {
          if (const int32_t k = a->speculator->length(limit, model_cost); k > 0) {
            model_drafts.push_back({a, k}), model_parts.push_back(parts.size());
            decode.n += k; // the budget it may take; the draft fills it below
          }
        } else if (limit > 0) {
          decode.draft = a->speculator->draft(limit, draft_cost);
          // An n-gram draft may continue into an image's row ids: it stops before them.
          const int32_t n_vocab = model_.config().n_vocab;
          auto bad = std::find_if(decode.draft.begin(), decode.draft.end(),
                                  [&](int32_t t) { return t < 0 || t >= n_vocab; });
          decode.draft.erase(bad, decode.draft.end());
          decode.n += int32_t(decode.draft.size());
        }
      }
      budget -= decode.n;
      parts.push_back(std::move(decode));
      continue;
    }
    size_t n = std::min<size_t>(
        {size_t(options_.max_write), size_t(budget), a->request.prompt.size() - a->computed});
    if (const size_t every = size_t(std::max(0, options_.snapshot_every)); every > 0) {
      n = std::min(n, every - a->computed % every); // stop at the next periodic snapshot
    }
    if (auto next = a->publish_at.upper_bound(int32_t(a->computed)); next != a->publish_at.end())
      n = std::min(n, size_t(*next) - a->computed); // and where others wait to share
    const bool scored = a->prompt_logprobs != nullptr;
    if (scored) {
      n = std::min(n, kScoredChunk - scored_rows);
      if (n == 0) continue; // its turn comes in a later step (the order rotates)
      scored_rows += n;
    }
    parts.push_back({a, int32_t(n), a->computed + n == a->request.prompt.size(), scored});
    budget -= int32_t(n);
  }
  if (!model_drafts.empty()) {
    std::vector<std::vector<int32_t>> drafts = draft_with_model(model_drafts);
    for (size_t i = 0; i < model_parts.size(); ++i) {
      Part &p = parts[model_parts[i]];
      if (int32_t(drafts[i].size()) < std::max(1, p.g->speculator->options().n_min))
        drafts[i].clear();
      p.draft = std::move(drafts[i]);
      p.n = 1 + int32_t(p.draft.size());
      if (!p.draft.empty()) p.g->speculator->drafted();
    }
  }
  return parts;
}

// One forward pass over `parts`, then each generation's cache length, prompt-end snapshot and
// next token.
void Engine::run_batch(const std::vector<Part> &parts) {
  model::Batch batch;
  std::vector<size_t> first_row(parts.size()); // each part's first row of logits
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part &p = parts[i];
    const int32_t first = int32_t(batch.tokens.size());
    const int32_t own = p.n - int32_t(p.draft.size()); // tokens the generation holds
    batch.tokens.insert(batch.tokens.end(), p.g->tokens.begin() + long(p.g->computed),
                        p.g->tokens.begin() + long(p.g->computed) + own);
    batch.tokens.insert(batch.tokens.end(), p.draft.begin(), p.draft.end());
    if (p.g->computed < p.g->request.prompt.size() && !p.g->request.embeddings.empty())
      append_embedding_rows(p.g->request, p.g->computed, size_t(own), first, batch);
    batch.spans.push_back({p.g->seq, int32_t(p.g->computed), p.n});
    first_row[i] = batch.logit_rows.size();
    if (p.all_rows || !p.draft.empty())
      for (int32_t j = 0; j < p.n; ++j) batch.logit_rows.push_back(first + j);
    else if (p.wants_logits)
      batch.logit_rows.push_back(first + p.n - 1);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = forward_->run(batch);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!logits.ok() && forward_->failed_span() >= 0) {
    // One span's storage could not be had (its pages, its budget): nothing was computed. That
    // request ends with the reason; the others run without it.
    const size_t bad = size_t(forward_->failed_span());
    Generation *failed = parts[bad].g;
    finish(*failed, FinishReason::Error, logits.message(), /*keep=*/false); // frees its pages
    settle({failed});
    std::vector<Part> rest = parts;
    rest.erase(rest.begin() + long(bad));
    if (!rest.empty()) run_batch(rest); // (the step is counted there)
    return;
  }
  // Learned only from batches of several parts: one part alone that fails (a request too deep
  // for the memory) says nothing of the others' steps.
  if (!logits.ok() && forward_->allocation_failed() && parts.size() > 1)
    allocatable_.failed(int32_t(batch.tokens.size()));
  else if (logits.ok())
    allocatable_.ran(int32_t(batch.tokens.size()), options_.step_tokens);
  if (!logits.ok() && forward_->allocation_failed() && parts.size() > 1) {
    // The step's graph could not be allocated (a device's memory, the compute buffer of this
    // many tokens): nothing was computed. Its parts run as two smaller steps; a part that still
    // cannot be allocated alone ends its own request (below).
    const auto half = parts.begin() + long(parts.size() / 2);
    run_batch(std::vector<Part>(parts.begin(), half));
    run_batch(std::vector<Part>(half, parts.end()));
    return;
  }
  if (!logits.ok() && forward_->allocation_failed() && !parts[0].draft.empty()) {
    // A verify span alone that cannot be allocated: its token runs without the draft (a draft
    // model's cache cut back to what is computed, as after a rejection).
    sync_draft(*parts[0].g);
    Part plain = parts[0];
    plain.n -= int32_t(plain.draft.size());
    plain.draft.clear();
    run_batch({plain});
    return;
  }
  if (!logits.ok() && forward_->allocation_failed() && parts[0].n > 1 && parts[0].draft.empty() &&
      parts[0].g->computed + size_t(parts[0].n) <= parts[0].g->request.prompt.size()) {
    // A prompt's chunk alone that still cannot be allocated: its first half runs (the rest in the
    // steps after), down to one token; its logits, where it wanted them, come with the last half.
    Part first = parts[0];
    first.n /= 2;
    first.wants_logits = false;
    run_batch({first});
    return;
  }
  ++stats_.steps;
  stats_.peak_step_logit_rows =
      std::max(stats_.peak_step_logit_rows, int64_t(batch.logit_rows.size()));
  int32_t prefill_tokens = 0;
  for (const Part &p : parts)
    if (p.g->computed < p.g->request.prompt.size()) prefill_tokens += p.n;
  const double share = double(prefill_tokens) / double(batch.tokens.size());
  stats_.prefill_seconds += seconds * share;
  stats_.decode_seconds += seconds * (1 - share);
  // A decode step's cost for the adaptive draft length: the forward pass alone (what follows it
  // is paid per token kept, as plain decoding pays it).
  if (prefill_tokens == 0 && logits.ok()) step_cost_.observe(int32_t(batch.tokens.size()), seconds);
  if (!logits.ok()) {
    // Nothing was committed, but a pass that computed part of its graph may have written ring
    // slots the sequences still claim: they are not kept. The requests of this step end with the
    // reason, the others go on (a request cancelled meanwhile is finished by the next step).
    std::vector<Generation *> failed;
    for (const Part &p : parts) {
      p.g->rows_unknown = true;
      failed.push_back(p.g), finish(*p.g, FinishReason::Error, logits.message());
    }
    settle(failed);
    return;
  }
  const size_t n_vocab = size_t(model_.config().n_vocab);
  std::vector<Generation *> done;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part &p = parts[i];
    Generation &a = *p.g;
    const bool prefill = a.computed < a.request.prompt.size();
    const float *rows = logits->data() + first_row[i] * n_vocab;
    if (!prefill) ++stats_.decode_spans;
    if (!p.draft.empty()) {
      if (!verify(a, rows, p.draft)) done.push_back(&a);
      continue;
    }
    if (p.all_rows) // row j follows position computed + j: the next prompt token's odds
      for (int32_t j = 0; j < p.n; ++j)
        if (const size_t next = a.computed + size_t(j) + 1; next < a.request.prompt.size())
          a.prompt_logprobs->push_back(sample::token_logprobs({rows + size_t(j) * n_vocab, n_vocab},
                                                              a.request.prompt[next],
                                                              std::max(0, a.request.top_logprobs)));
    a.computed += size_t(p.n);
    if (prefill) stats_.computed_prompt_tokens += p.n;
    if (prefill && publish_prefix(a)) evict_over_budget(); // for requests waiting on this prefix
    const size_t every = size_t(std::max(0, options_.snapshot_every));
    const bool periodic = prefill && every > 0 && a.computed % every == 0;
    int32_t start = prefill && (every > 0 || options_.start_snapshots)
                        ? message_start_near(a, a.computed - size_t(p.n), a.computed)
                        : -1;
    // A start the rings no longer reach (a chunk ending more than the ring's lead past it, where
    // the chunk is longer than the lead) gets no snapshot from this chunk: none of the edits it
    // serves could resume from it. The chunk before the start's does, and resumes them exactly
    // after recomputing at most one chunk.
    if (start >= 0 && store_->sequence(a.seq)->rewind_floor() > start + options_.snapshot_reach)
      start = -1;
    if (start >= 0) { // at most kSnapshotsPerStart for one start (what admission counted)
      if (start != a.near_start) a.near_start = start, a.near_start_snapshots = 0;
      if (a.near_start_snapshots++ >= kSnapshotsPerStart) start = -1;
    }
    std::span<const float> l;
    if (p.wants_logits) l = {rows + (p.all_rows ? size_t(p.n - 1) * n_vocab : 0), n_vocab};
    if (prefill && (p.wants_logits || periodic || start >= 0) && options_.prefix_reuse &&
        options_.max_cached > 0 && store_->layout().has_ring()) {
      // A prompt's end (the point a later request resending this history comes back to, with the
      // logits that serve the same prompt again), a periodic point inside a long prompt, or the
      // end of a chunk near a message start, reaching back over it as far as the rings hold (an
      // edited message): the ring's lead past the window once it wrapped (cache::Policy::
      // ring_reach + 1). The chunk ending just before a start reaches over its side; the one
      // holding it, over the start if the start lies within the lead of the chunk's end; the
      // one just after it likewise. Chunks are not cut for this: message starts change no chunk
      // boundary, hence no float rounding (an edit the snapshots miss resumes from the end of
      // the chunk before, recomputing at most one chunk).
      const int32_t reach =
          std::max(options_.snapshot_reach,
                   start >= 0 ? int32_t(a.computed) - start + options_.snapshot_reach : 0);
      if (auto snap = store_->snapshot(a.seq, reach); snap.ok()) {
        try {
          a.taken.push_back({int32_t(a.computed), std::move(snap).value(),
                             std::vector<float>(l.begin(), l.end())});
          trim_taken(a);
        } catch (const std::bad_alloc &) {
          // Its logits' copy: one reuse point fewer (the snapshot goes with `snap`).
        }
      }
    }
    if (!p.wants_logits) continue;
    // (A prompt scored without an answer ends every choice at once: nothing to fork.)
    if (prefill && a.request.n > 1 && a.request.max_tokens > 0) spawn_choices(a, l);
    if (!advance(a, l)) done.push_back(&a);
  }
  settle(done);
}

bool Engine::advance(Generation &a, std::span<const float> logits, int32_t *drawn, int32_t drafted,
                     int32_t chosen) {
  try {
    return advance_unguarded(a, logits, drawn, drafted, chosen);
  } catch (const std::bad_alloc &) {
    // Once finish() has begun (its events, caching the sequence) the request cannot be ended
    // again: that is not contained.
    if (a.finishing) throw;
    // Not kept for reuse: under memory pressure the cache should not grow.
    finish(a, FinishReason::Error,
           "out of memory while sampling this request's next token (its grammar's tables, its "
           "logits, its log-probabilities)",
           /*keep=*/false);
    return false;
  }
}

bool Engine::advance_unguarded(Generation &a, std::span<const float> logits, int32_t *drawn,
                               int32_t drafted, int32_t chosen) {
  if (options_.sampling_fault && options_.sampling_fault(a.id)) throw std::bad_alloc();
  if (a.request.max_tokens == 0) { // the prompt only
    finish(a, FinishReason::Length);
    return false;
  }
  const std::span<const float> model_logits = logits; // what log-probabilities report
  if (a.grammar && chosen < 0) {
    masked_logits_.assign(logits.begin(), logits.end());
    if (Status s = a.grammar->mask_logits(masked_logits_); !s.ok()) {
      finish(a, FinishReason::Error, s.message());
      return false;
    }
    logits = masked_logits_;
  }
  auto token = chosen >= 0 ? Result<int32_t>(chosen) : a.sampler->sample_checked(logits, a.tokens);
  if (!token.ok()) {
    finish(a, FinishReason::Error, token.message());
    return false;
  }
  if (a.grammar && !a.grammar->accept_token(*token)) {
    // The mask allowed it: either reading it met more parses than the matcher walks (the mask
    // checks each parse alone), or it is our bug.
    finish(a, FinishReason::Error,
           a.grammar->too_ambiguous() ? sample::too_ambiguous_error().message()
                                      : "internal: the grammar refused a token its mask allowed");
    return false;
  }
  if (drawn) *drawn = *token;
  if (drafted >= 0) ++a.span_tested, a.span_kept += *token == drafted;
  ++a.generated;
  ++stats_.generated_tokens;
  const bool stop = std::find(a.request.stop_tokens.begin(), a.request.stop_tokens.end(), *token) !=
                    a.request.stop_tokens.end();
  const bool length =
      a.generated >= a.request.max_tokens || int32_t(a.tokens.size()) + 1 > options_.context;
  Event e;
  e.request = a.id, e.token = *token, e.choice = a.choice, e.cached_tokens = a.reused;
  if (a.request.top_logprobs >= 0)
    e.logprobs = sample::token_logprobs(model_logits, *token, a.request.top_logprobs);
  attach_prompt_logprobs(a, e);
  if (a.on_event) a.on_event(e);
  if (stop || length) {
    finish(a, stop ? FinishReason::Stop : FinishReason::Length);
    return false;
  }
  a.tokens.push_back(*token); // fed back in the next step
  if (a.speculator) a.speculator->append(*token);
  return true;
}

void Engine::spawn_choices(Generation &a, std::span<const float> logits) {
  for (int32_t c = 1; c < a.request.n; ++c) {
    Result<std::unique_ptr<Generation>> child = Status();
    try {
      born_.reserve(born_.size() + size_t(a.request.n - c)); // the places taken below
      child = start_choice(a, c);
    } catch (const std::bad_alloc &) {
      // Its copies of the request and the prompt, its drafter, its grammar matcher (start_choice
      // holds no sequence when it throws): that choice ends, the others go on.
      child = Status::error("out of memory while starting choice " + std::to_string(c));
    }
    a.choices_started = c + 1; // from here its last event is its own (end_events)
    if (!child.ok()) {
      Event e;
      e.request = a.id, e.finish = FinishReason::Error, e.choice = c, e.error = child.message();
      if (a.on_event) a.on_event(e);
      continue;
    }
    Generation &g = **child;
    born_.push_back(std::move(child).value()); // (reserved) settled into active_ by the step
    if (!advance(g, logits)) born_.pop_back();
  }
}

Result<std::unique_ptr<Engine::Generation>> Engine::start_choice(Generation &a, int32_t c) {
  // Everything that may throw std::bad_alloc comes before the fork, or releases it.
  auto child = std::make_unique<Generation>();
  child->id = a.id;
  child->choice = c;
  child->request = a.request;
  child->request.n = 1;
  child->on_event = a.on_event;
  child->tokens = a.request.prompt;
  child->prompt_logprobs = a.prompt_logprobs;
  child->computed = a.request.prompt.size();
  child->speculator = a.speculator; // its history: the prompt
  sample::SamplingParams sp = a.request.sampling;
  sp.seed += uint64_t(c);
  auto sampler = sample::Sampler::create(sp, model_.config().n_vocab);
  auto seq = store_->fork(a.seq, int32_t(a.computed)); // the prompt, computed once
  if (!sampler.ok() || !seq.ok()) {
    if (seq.ok()) (void)store_->remove_sequence(*seq);
    return !seq.ok() ? seq.status() : sampler.status();
  }
  try {
    store_->set_role(*seq, kv::SeqRole::Active);
    if (a.request.grammar) child->grammar.emplace(a.request.grammar);
  } catch (const std::bad_alloc &) {
    (void)store_->remove_sequence(*seq);
    throw;
  }
  child->sampler = std::move(sampler).value();
  child->seq = *seq;
  return child;
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

sample::SamplingParams default_sampling(const model::Model &model) {
  sample::SamplingParams p;
  if (const model::RecommendedSampling *r = model.architecture().sampling) {
    p.temperature = r->temperature;
    p.top_p = r->top_p;
    p.top_k = r->top_k;
    p.min_p = r->min_p;
  }
  return p;
}

} // namespace offgraph::engine
