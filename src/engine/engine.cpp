#include "engine/engine.h"

#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>

namespace offgraph::engine {

Result<std::unique_ptr<Engine>> Engine::create(const model::Model &model, EngineOptions options) {
  if (options.context < 2 || options.max_write < 1 || options.step_tokens < 1 ||
      options.max_active < 1 || options.max_cached < 0)
    return Status::error(
        "engine: context >= 2, max_write, step_tokens and max_active >= 1, max_cached >= 0");
  options.max_write = std::min(options.max_write, options.context);
  std::unique_ptr<Engine> e(new Engine(model, options));
  auto layout =
      model::make_layout(model, {options.context, options.max_write, options.page_rows});
  if (!layout.ok()) return layout.status();
  auto store = kv::KvStore::create(*layout, options.types, ggml_backend_cpu_buffer_type());
  if (!store.ok()) return store.status();
  e->store_ = std::move(store).value();
  e->store_->set_memory_budget(options.kv_budget);
  e->forward_ = std::make_unique<model::Forward>(model, *e->store_, options.threads);
  return e;
}

Result<uint64_t> Engine::submit(Request request, std::function<void(const Event &)> on_event) {
  if (request.prompt.empty()) return Status::error("the prompt is empty");
  if (request.max_tokens < 1) return Status::error("max_tokens must be at least 1");
  if (request.n < 1 || request.n > 16) return Status::error("n must be between 1 and 16");
  const int64_t need = int64_t(request.prompt.size()) + request.max_tokens;
  if (need > options_.context)
    return Status::error("the prompt has " + std::to_string(request.prompt.size()) +
                         " tokens and asks for up to " + std::to_string(request.max_tokens) +
                         " more, " + std::to_string(need) + " in all; the context holds " +
                         std::to_string(options_.context));
  auto sampler = sample::Sampler::create(request.sampling, model_.config().n_vocab);
  if (!sampler.ok()) return sampler.status();
  std::optional<sample::Constraint> constraint;
  if (request.constraint) {
    auto c = sample::Constraint::create(request.constraint, request.token_texts);
    if (!c.ok()) return c.status();
    constraint = std::move(c).value();
  }
  auto a = std::make_unique<Generation>();
  a->constraint = std::move(constraint);
  a->request = std::move(request);
  a->on_event = std::move(on_event);
  a->sampler = std::move(sampler).value();
  std::lock_guard lock(inbox_mutex_);
  if (waiting_ >= options_.max_queue)
    return Status::error("the queue is full (" + std::to_string(options_.max_queue) +
                         " waiting requests)");
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
  for (auto &a : inbox_) queue_.push_back(std::move(a));
  inbox_.clear();
  for (const auto &[id, choice] : cancels_) {
    // A queued request has not forked its choices yet: cancelling one of them cancels it only
    // when it is the only one.
    for (auto &a : active_)
      if (a->id == id && (choice < 0 || a->choice == choice)) a->cancelled = true;
    for (auto &a : queue_)
      if (a->id == id && (choice < 0 || a->request.n == 1)) a->cancelled = true;
  }
  cancels_.clear();
  if (cancel_all_) {
    for (auto &a : active_) a->cancelled = true;
    for (auto &a : queue_) a->cancelled = true;
    cancel_all_ = false;
  }
}

void Engine::publish() {
  Load l;
  l.active = active_.size();
  l.queued = waiting_;
  l.cached = cached_.size();
  l.cached_bytes = cached_bytes();
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

int64_t Engine::cached_bytes() const {
  int64_t bytes = 0;
  for (const Cached &c : cached_)
    bytes += store_->memory(c.seq).buffers + (c.prompt_snapshot ? c.prompt_snapshot->bytes() : 0) +
             int64_t(c.prompt_logits.size() * sizeof(float));
  return bytes;
}

void Engine::evict_lru() {
  auto lru = std::min_element(cached_.begin(), cached_.end(), [](const Cached &x, const Cached &y) {
    return x.last_used < y.last_used;
  });
  (void)store_->remove_sequence(lru->seq);
  cached_.erase(lru);
  ++stats_.cache_evictions;
}

void Engine::evict_over_budget() {
  while (!cached_.empty() &&
         (int32_t(cached_.size()) > options_.max_cached ||
          (options_.cache_budget > 0 && cached_bytes() > options_.cache_budget)))
    evict_lru();
}

int64_t Engine::peak_bytes(const Generation &a) const {
  // Each choice may grow to the full length and keep a prompt-end snapshot (at most the rings).
  const int32_t length = int32_t(a.request.prompt.size()) + a.request.max_tokens;
  const int64_t snapshot = store_->layout().has_ring() ? store_->peak_bytes_at_length(0) : 0;
  return int64_t(a.request.n) * (store_->peak_bytes_at_length(length) + snapshot);
}

Result<bool> Engine::memory_allows(const Generation &a) {
  if (options_.kv_budget <= 0) return true;
  const int64_t need = peak_bytes(a);
  if (need > options_.kv_budget)
    return Status::error("the request may need " + std::to_string(need) +
                         " bytes of KV cache (prompt + max_tokens" +
                         (a.request.n > 1 ? ", times n" : "") + "); the budget is " +
                         std::to_string(options_.kv_budget));
  int64_t reserved = 0;
  for (const auto &b : active_) // a request with n choices forks them when its prompt is done
    reserved +=
        b->computed < b->request.prompt.size() ? peak_bytes(*b) : peak_bytes(*b) / b->request.n;
  // Cached conversations give way, least recently used first (the one this request would reuse
  // may go too: correctness does not depend on it, only the work saved).
  while (reserved + need + cached_bytes() > options_.kv_budget && !cached_.empty()) evict_lru();
  return reserved + need <= options_.kv_budget;
}

Status Engine::admit(Generation &a) {
  const std::vector<int32_t> &prompt = a.request.prompt;
  // The cached sequence that saves the most work: rewound to the common prefix where its rings
  // still hold it, else brought back to its prompt's end by the snapshot taken there.
  size_t best = cached_.size();
  int32_t best_reuse = 0;
  bool best_by_snapshot = false;
  for (size_t i = 0; i < cached_.size(); ++i) {
    const Cached &c = cached_[i];
    size_t lcp = 0;
    while (lcp < c.tokens.size() && lcp < prompt.size() && c.tokens[lcp] == prompt[lcp]) ++lcp;
    const int32_t target = int32_t(std::min(lcp, prompt.size() - 1)); // recompute the last token
    const cache::Sequence &seq = *store_->sequence(c.seq);
    int32_t reuse = 0;
    bool by_snapshot = false;
    const int32_t snap = c.prompt_snapshot ? c.prompt_snapshot->length() : 0;
    if (snap > 0 && size_t(snap) == prompt.size() && lcp == prompt.size() &&
        !c.prompt_logits.empty()) {
      reuse = snap; // the same prompt again: its snapshot and logits serve it whole
      by_snapshot = true;
    } else if (target > 0 && target >= seq.rewind_floor()) {
      reuse = target;
    } else if (snap > 0 && snap <= target) {
      reuse = snap;
      by_snapshot = true;
    }
    if (reuse > best_reuse) best = i, best_reuse = reuse, best_by_snapshot = by_snapshot;
  }
  if (best < cached_.size()) {
    Cached c = std::move(cached_[best]);
    cached_.erase(cached_.begin() + long(best));
    Status s = best_by_snapshot ? store_->restore(c.seq, *c.prompt_snapshot)
                                : store_->rewind(c.seq, best_reuse);
    if (s.ok()) {
      if (size_t(best_reuse) == prompt.size()) {
        // Nothing to compute: the first token is sampled from the stored logits, and the
        // snapshot stays with the conversation for the next time.
        a.prompt_logits = std::move(c.prompt_logits);
        a.prompt_snapshot = std::move(c.prompt_snapshot);
        a.logits_ready = true;
      }
      a.seq = c.seq;
      a.computed = size_t(best_reuse);
      a.reused = best_reuse;
      stats_.reused_prompt_tokens += best_reuse;
      stats_.snapshot_restores += best_by_snapshot;
      ++stats_.prefix_hits;
      a.tokens = prompt;
      return ok_status();
    }
    (void)store_->remove_sequence(c.seq); // cannot happen by construction; never reuse it
  }
  // A fresh sequence; make room by dropping the least recently used cached ones if needed.
  for (;;) {
    const bool room =
        int32_t(active_.size() + cached_.size()) < options_.max_active + options_.max_cached;
    if (room) {
      auto seq = store_->create_sequence();
      if (seq.ok()) {
        a.seq = *seq;
        a.tokens = prompt;
        a.computed = 0;
        return ok_status();
      }
      if (cached_.empty()) return seq.status();
    }
    if (cached_.empty()) return Status::error("engine: no sequence available");
    evict_lru();
  }
}

void Engine::end_events(Generation &a, FinishReason reason, const std::string &error) {
  Event e;
  e.request = a.id;
  e.finish = reason;
  e.error = error;
  e.cached_tokens = a.reused;
  e.choice = a.choice;
  if (!a.on_event) return;
  a.on_event(e);
  // Choices that were never forked end with their request, so that each choice of a request
  // sees exactly one last event.
  if (a.choice == 0 && !a.spawned)
    for (int32_t c = 1; c < a.request.n; ++c) {
      e.choice = c;
      a.on_event(e);
    }
}

void Engine::finish(Generation &a, FinishReason reason, const std::string &error) {
  end_events(a, reason, error);
  // Keep what the sequence holds for prefix reuse; the least recently used goes first.
  Cached c{a.seq, std::vector<int32_t>(a.tokens.begin(), a.tokens.begin() + long(a.computed)),
           std::move(a.prompt_snapshot), ++clock_, std::move(a.prompt_logits)};
  if (options_.max_cached == 0 || !options_.prefix_reuse || c.tokens.empty()) {
    (void)store_->remove_sequence(c.seq);
    return;
  }
  cached_.push_back(std::move(c));
  evict_over_budget();
}

bool Engine::step() {
  const bool worked = step_inner();
  publish();
  return worked;
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

void Engine::settle(const std::vector<Generation *> &gone,
                    std::vector<std::unique_ptr<Generation>> born) {
  std::erase_if(active_, [&](const auto &a) {
    return std::find(gone.begin(), gone.end(), a.get()) != gone.end();
  });
  for (auto &b : born) active_.push_back(std::move(b));
}

// Cancelled requests leave first. Callbacks run after the containers are updated: they may
// submit or cancel.
void Engine::drop_cancelled() {
  std::vector<std::unique_ptr<Generation>> dropped;
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
  while (int32_t(active_.size()) < options_.max_active && !queue_.empty()) {
    // First come, first served: the head waits for memory rather than being overtaken.
    auto fits = memory_allows(*queue_.front());
    if (fits.ok() && !*fits) {
      if (!active_.empty()) {
        ++stats_.waits_for_memory;
        break;
      }
      fits = Status::error("the KV memory budget cannot hold this request even alone");
    }
    std::unique_ptr<Generation> a = std::move(queue_.front());
    queue_.pop_front();
    --waiting_;
    if (!fits.ok()) {
      end_events(*a, FinishReason::Error, fits.message());
      continue;
    }
    if (Status s = admit(*a); !s.ok()) {
      end_events(*a, FinishReason::Error, s.message());
      continue;
    }
    stats_.prompt_tokens += int64_t(a->request.prompt.size());
    active_.push_back(std::move(a));
  }
}

// Requests whose whole prompt came back with its logits take their first token now.
bool Engine::sample_restored_prompts() {
  bool sampled = false;
  std::vector<Generation *> done;
  std::vector<std::unique_ptr<Generation>> born;
  for (auto &a : active_) {
    if (!a->logits_ready) continue;
    a->logits_ready = false;
    sampled = true;
    const std::vector<float> logits = a->prompt_logits;
    if (a->request.n > 1) spawn_choices(*a, logits, born);
    if (!advance(*a, logits)) done.push_back(a.get());
  }
  settle(done, std::move(born));
  return sampled;
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
  int32_t budget = options_.step_tokens;
  for (Generation *a : order) {
    if (budget <= 0) break;
    if (a->computed >= a->request.prompt.size()) {
      if (a->computed + 1 == a->tokens.size()) parts.push_back({a, 1, true}), --budget; // decode
      continue;
    }
    const int32_t n = int32_t(std::min<size_t>(
        {size_t(options_.max_write), size_t(budget), a->request.prompt.size() - a->computed}));
    parts.push_back({a, n, a->computed + size_t(n) == a->request.prompt.size()});
    budget -= n;
  }
  return parts;
}

// One forward pass over `parts`, then each generation's cache length, prompt-end snapshot and
// next token.
void Engine::run_batch(const std::vector<Part> &parts) {
  model::Batch batch;
  for (const Part &p : parts) {
    const int32_t first = int32_t(batch.tokens.size());
    batch.tokens.insert(batch.tokens.end(), p.g->tokens.begin() + long(p.g->computed),
                        p.g->tokens.begin() + long(p.g->computed) + p.n);
    batch.spans.push_back({p.g->seq, int32_t(p.g->computed), p.n});
    if (p.wants_logits) batch.logit_rows.push_back(first + p.n - 1);
  }
  // A step of prefill chunks alone still asks for one row (unused): the graph needs an output.
  if (batch.logit_rows.empty()) batch.logit_rows.push_back(int32_t(batch.tokens.size()) - 1);
  ++stats_.steps;
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = forward_->run(batch);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int32_t prefill_tokens = 0;
  for (const Part &p : parts)
    if (p.g->computed < p.g->request.prompt.size()) prefill_tokens += p.n;
  const double share = double(prefill_tokens) / double(batch.tokens.size());
  stats_.prefill_seconds += seconds * share;
  stats_.decode_seconds += seconds * (1 - share);
  if (!logits.ok()) {
    // Nothing was committed; the requests of this step end with the reason, the others go on
    // (a request cancelled meanwhile is finished by the next step, not dropped here).
    std::vector<Generation *> failed;
    for (const Part &p : parts)
      failed.push_back(p.g), finish(*p.g, FinishReason::Error, logits.message());
    settle(failed);
    return;
  }
  const int32_t n_vocab = model_.config().n_vocab;
  size_t row = 0;
  std::vector<Generation *> done;
  std::vector<std::unique_ptr<Generation>> born;
  for (const Part &p : parts) {
    Generation &a = *p.g;
    const bool prefill = a.computed < a.request.prompt.size();
    a.computed += size_t(p.n);
    if (prefill) stats_.computed_prompt_tokens += p.n;
    if (!p.wants_logits) continue;
    std::span<const float> l(logits->data() + row * size_t(n_vocab), size_t(n_vocab));
    ++row;
    if (prefill && options_.prefix_reuse && options_.max_cached > 0 &&
        store_->layout().has_ring()) {
      // The prompt's end: the point a later request resending this history will come back to.
      if (auto snap = store_->snapshot(a.seq); snap.ok()) {
        a.prompt_snapshot = std::move(snap).value();
        a.prompt_logits.assign(l.begin(), l.end()); // serves the same prompt again, whole
      }
    }
    if (prefill && a.request.n > 1) spawn_choices(a, l, born);
    if (!advance(a, l)) done.push_back(&a);
  }
  settle(done, std::move(born));
}

bool Engine::advance(Generation &a, std::span<const float> logits) {
  std::vector<float> masked;
  if (a.constraint && a.constraint->active()) {
    masked.assign(logits.begin(), logits.end());
    if (Status s = a.constraint->mask(masked); !s.ok()) {
      finish(a, FinishReason::Error, s.message());
      return false;
    }
    logits = masked;
  }
  auto token = a.sampler->sample_checked(logits, a.tokens);
  if (!token.ok()) {
    finish(a, FinishReason::Error, token.message());
    return false;
  }
  if (a.constraint) a.constraint->accept(*token);
  ++a.generated;
  ++stats_.generated_tokens;
  const bool stop = std::find(a.request.stop_tokens.begin(), a.request.stop_tokens.end(), *token) !=
                    a.request.stop_tokens.end();
  const bool length =
      a.generated >= a.request.max_tokens || int32_t(a.tokens.size()) + 1 > options_.context;
  Event e{a.id, *token, FinishReason::None, "", 0, a.choice};
  if (a.on_event) a.on_event(e);
  if (stop || length) {
    finish(a, stop ? FinishReason::Stop : FinishReason::Length);
    return false;
  }
  a.tokens.push_back(*token); // fed back in the next step
  return true;
}

void Engine::spawn_choices(Generation &a, std::span<const float> logits,
                           std::vector<std::unique_ptr<Generation>> &born) {
  a.spawned = true;
  for (int32_t c = 1; c < a.request.n; ++c) {
    auto child = std::make_unique<Generation>();
    child->id = a.id;
    child->choice = c;
    child->request = a.request;
    child->request.n = 1;
    child->on_event = a.on_event;
    child->tokens = a.request.prompt;
    child->computed = a.request.prompt.size();
    sample::SamplingParams sp = a.request.sampling;
    sp.seed += uint64_t(c);
    auto sampler = sample::Sampler::create(sp, model_.config().n_vocab);
    auto seq = store_->fork(a.seq, int32_t(a.computed)); // the prompt, computed once
    if (!sampler.ok() || !seq.ok()) {
      Event e{a.id, -1, FinishReason::Error, !seq.ok() ? seq.message() : sampler.message(), 0, c};
      if (a.on_event) a.on_event(e);
      if (seq.ok()) (void)store_->remove_sequence(*seq);
      continue;
    }
    child->sampler = std::move(sampler).value();
    child->seq = *seq;
    if (a.request.constraint)
      if (auto k = sample::Constraint::create(a.request.constraint, a.request.token_texts); k.ok())
        child->constraint = std::move(k).value();
    if (advance(*child, logits)) born.push_back(std::move(child));
  }
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

} // namespace offgraph::engine
