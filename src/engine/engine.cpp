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
      options.kv_budget < EngineOptions::kKvBudgetFromMemory ||
      options.compute_budget < EngineOptions::kComputeBudgetFromMemory)
    return Status::error("engine: context >= 2, max_write, step_tokens, max_active and page_rows "
                         ">= 1, max_cached, snapshot_every and snapshot_reach >= 0, kv_budget and "
                         "compute_budget >= -1 (from memory)");
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
    if (options.draft_kv_fault) e->draft_store_->set_fault(options.draft_kv_fault);
  } else if (options.speculation.source == DraftSource::Draft) {
    return Status::error("speculative decoding with a draft model needs one (a draft model file)");
  }
  // The draft's caches follow the target's sequences: its budget is the KV budget's share in
  // proportion to one full-context sequence of each. Past it a draft is not started (or cached
  // drafts go first): speculation slows, answers stay the same.
  const int64_t target_peak = e->store_->peak_bytes_at_length(options.context);
  const double draft_share =
      e->draft_store_ && target_peak > 0
          ? double(e->draft_store_->peak_bytes_at_length(options.context)) / double(target_peak)
          : 0.0;
  if (options.kv_budget == EngineOptions::kKvBudgetFromMemory) {
    // What the store can hold at most: the page pool, and beside it (the budget counts them
    // too) every sequence's rings, a prompt-end snapshot per cached conversation, and the
    // snapshots inside prompts.
    const int64_t rings = e->store_->peak_bytes_at_length(0);
    const int64_t snapshots = options.snapshot_budget != 0 ? options.snapshot_budget : target_peak;
    const int64_t most =
        snapshots < 0 // snapshots without a limit: no cap
            ? 0
            : int64_t(e->store_->pages().max_pages()) * e->store_->page_bytes() +
                  rings * (int64_t(options.max_active) + 2 * int64_t(options.max_cached)) +
                  snapshots;
    e->options_.kv_budget = kv_budget_from_memory(
        kv_device_memory(*e->store_, options.context, e->draft_store_.get(), draft_share), most,
        target_peak + rings);
  }
  e->store_->set_memory_budget(e->options_.kv_budget);
  e->forward_ = std::make_unique<model::Forward>(model, *e->store_, options.threads);
  if (options.allocation_fault) e->forward_->set_allocation_fault(options.allocation_fault);
  if (e->draft_store_) {
    if (e->options_.kv_budget > 0 && draft_share > 0)
      e->draft_store_->set_memory_budget(
          std::max<int64_t>(1, int64_t(double(e->options_.kv_budget) * draft_share)));
    e->draft_forward_ =
        std::make_unique<model::Forward>(*options.draft_model, *e->draft_store_, options.threads);
    if (options.draft_allocation_fault)
      e->draft_forward_->set_allocation_fault(options.draft_allocation_fault);
  }
  e->budget_by_device_ =
      budget_parts_by_device(*e->store_, options.context, e->options_.kv_budget, "kv");
  if (e->draft_store_)
    for (const Load::DeviceBytes &d : budget_parts_by_device(
             *e->draft_store_, options.context, e->draft_store_->memory_budget(), "draft_kv"))
      e->budget_by_device_.push_back(d);
  if (Status s = e->set_compute_budget(); !s.ok()) return s;
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
  stats_.compute_budget_refusals =
      forward_->compute_refusals() + (draft_forward_ ? draft_forward_->compute_refusals() : 0);
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
  send_end(a.on_event, e);
  // Choices that were never forked end with their request, so that each choice of a request
  // sees exactly one last event.
  if (a.choice == 0)
    for (int32_t c = a.choices_started; c < a.request.n; ++c) {
      e.choice = c;
      send_end(a.on_event, e);
    }
}

void Engine::send_end(const std::function<void(const Event &)> &on_event, const Event &e) {
  try {
    on_event(e);
  } catch (const std::bad_alloc &) {
    // The receiver could not take it (its queue, its message): kept and sent again at the next
    // steps, so that every request still sees its last event and the step goes on.
    try {
      undelivered_.push_back({on_event, e, 1});
    } catch (const std::bad_alloc &) {
      ++stats_.lost_end_events; // not even that: counted
    }
  }
}

void Engine::send_undelivered() {
  for (auto it = undelivered_.begin(); it != undelivered_.end();) {
    try {
      it->on_event(it->event);
      it = undelivered_.erase(it);
    } catch (const std::bad_alloc &) {
      if (++it->tries < kEndTries) {
        ++it;
      } else { // a receiver that never takes it: it goes, counted
        ++stats_.lost_end_events;
        it = undelivered_.erase(it);
      }
    }
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
  send_undelivered();
  take_inbox();
  drop_cancelled();
  admit_queued();
  const bool sampled = sample_restored_prompts();
  if (active_.empty()) return sampled || !undelivered_.empty();
  run_batch(plan_batch());
  if (options_.step_fault && options_.step_fault(stats_.steps)) throw std::bad_alloc();
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
      if (a.on_event) send_end(a.on_event, e);
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
