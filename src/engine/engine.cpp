#include "engine/engine.h"

#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <limits>

namespace offgraph::engine {
namespace {

// Prefill chunk of a scored prompt (Request::prompt_logprobs), whose every row of logits is
// read: 64 rows of Muse Glimmer's 202,048 logits are 52 MB.
constexpr size_t kScoredChunk = 64;

// Snapshots kept near one message start: the chunks before, holding and after it cover it when
// chunks are long; short ones (a busy step's budget) would take one each.
constexpr int32_t kSnapshotsPerStart = 3;

// How many leading tokens a and b share.
size_t shared_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  return size_t(std::mismatch(a.begin(), a.begin() + long(n), b.begin()).first - a.begin());
}

} // namespace

Result<std::unique_ptr<Engine>> Engine::create(const model::Model &model, EngineOptions options) {
  if (options.context < 2 || options.max_write < 1 || options.step_tokens < 1 ||
      options.max_active < 1 || options.max_cached < 0 || options.snapshot_every < 0 ||
      options.snapshot_reach < 0 || options.page_rows < 1)
    return Status::error("engine: context >= 2, max_write, step_tokens, max_active and page_rows "
                         ">= 1, max_cached, snapshot_every and snapshot_reach >= 0");
  options.max_write = std::min(options.max_write, options.context);
  if (Status s = validate(options.speculation); !s.ok()) return s;
  if (options.speculation.source != DraftSource::None && options.max_write < 2)
    return Status::error("speculative decoding verifies spans of at least 2 tokens; max_write (the "
                         "prefill chunk) is " +
                         std::to_string(options.max_write));
  std::unique_ptr<Engine> e(new Engine(model, options));
  auto layout = model::make_layout(model, {options.context, options.max_write, options.page_rows});
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
  e->store_->set_memory_budget(options.kv_budget);
  e->forward_ = std::make_unique<model::Forward>(model, *e->store_, options.threads);
  if (const model::Model *d = options.draft_model) {
    if (d->config().n_vocab != model.config().n_vocab)
      return Status::error("the draft model has " + std::to_string(d->config().n_vocab) +
                           " tokens; the model has " + std::to_string(model.config().n_vocab) +
                           " (a draft must share the vocabulary)");
    auto draft_layout =
        model::make_layout(*d, {options.context, options.max_write, options.page_rows});
    if (!draft_layout.ok()) return draft_layout.status();
    auto draft_store = kv::KvStore::create(*draft_layout, options.types, d->cache_buffer_types());
    if (!draft_store.ok()) return draft_store.status();
    e->draft_store_ = std::move(draft_store).value();
    e->draft_forward_ = std::make_unique<model::Forward>(*d, *e->draft_store_, options.threads);
  } else if (options.speculation.source == DraftSource::Draft) {
    return Status::error("speculative decoding with a draft model needs one (a draft model file)");
  }
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
  const int64_t need = int64_t(request.prompt.size()) + request.max_tokens;
  if (need > options_.context)
    return Status::error("the prompt has " + std::to_string(request.prompt.size()) +
                         " tokens and asks for up to " + std::to_string(request.max_tokens) +
                         " more, " + std::to_string(need) + " in all; the context holds " +
                         std::to_string(options_.context));
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
  for (auto &a : inbox_) queue_.push_back(std::move(a));
  inbox_.clear();
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

void Engine::publish() {
  Load l;
  l.active = active_.size();
  l.queued = waiting_;
  l.cached = cached_.size();
  l.cached_bytes = cached_bytes();
  l.tree_nodes = tree_.n_nodes();
  l.snapshots = saved_.size();
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
  // Runs every step (publish): marks in a flat array by page id, not a set. 1: an active request
  // holds the page (it counts there); 2: already counted here.
  std::vector<uint8_t> mark(size_t(store_->pages().touched()), 0);
  for (const auto &g : active_)
    if (const cache::PageTable *t = store_->page_table(g->seq))
      for (cache::PageId p : t->pages) mark[size_t(p)] = 1;
  int64_t bytes = 0, pages = 0;
  for (const auto &[seq, c] : cached_) {
    bytes += store_->memory(seq).ring;
    for (cache::PageId p : store_->page_table(seq)->pages)
      if (mark[size_t(p)] == 0) mark[size_t(p)] = 2, ++pages;
  }
  bytes += pages * store_->page_bytes();
  for (const auto &[id, saved] : saved_)
    bytes += saved.snapshot->bytes() + int64_t(saved.logits.size() * sizeof(float));
  return bytes;
}

void Engine::free_snapshots(const std::vector<PrefixTree::SnapshotId> &ids) {
  for (PrefixTree::SnapshotId id : ids) stats_.snapshot_evictions += saved_.erase(id);
}

void Engine::drop_cached(kv::SeqId s) {
  if (auto d = cached_drafts_.find(s); d != cached_drafts_.end()) {
    (void)draft_store_->remove_sequence(d->second.first);
    cached_drafts_.erase(d);
  }
  cached_.erase(s);
  free_snapshots(tree_.remove_sequence(s));
  (void)store_->remove_sequence(s);
}

void Engine::evict_lru(bool sequences_only) {
  // The least recently used of the cached sequences and snapshots: a snapshot only loses a
  // reuse point; a sequence takes its pages and the snapshots no other sequence passes through.
  auto seq = std::min_element(cached_.begin(), cached_.end(), [](const auto &x, const auto &y) {
    return x.second.last_used < y.second.last_used;
  });
  auto snap = std::min_element(saved_.begin(), saved_.end(), [](const auto &x, const auto &y) {
    return x.second.last_used < y.second.last_used;
  });
  if (!sequences_only && snap != saved_.end() &&
      (seq == cached_.end() || snap->second.last_used < seq->second.last_used)) {
    tree_.remove_snapshot(snap->first);
    saved_.erase(snap);
    ++stats_.snapshot_evictions;
    return;
  }
  if (seq == cached_.end()) return;
  drop_cached(seq->first);
  ++stats_.cache_evictions;
}

void Engine::evict_over_budget() {
  // max_cached counts sequences: only they go for it (a snapshot on the path of the sequences
  // that stay keeps serving them). Bytes: whichever was used least recently.
  while (int32_t(cached_.size()) > options_.max_cached) evict_lru(true);
  while ((!cached_.empty() || !saved_.empty()) && options_.cache_budget > 0 &&
         cached_bytes() > options_.cache_budget)
    evict_lru();
}

int64_t Engine::peak_bytes(const Generation &a) const {
  // Each choice may grow to the full length; the prompt keeps a snapshot at its end, one every
  // snapshot_every tokens and at most kSnapshotsPerStart per message start, and one where requests
  // wait to share it (each at most the rings).
  const int32_t prompt = int32_t(a.request.prompt.size());
  const int32_t length = prompt + a.request.max_tokens;
  int64_t snapshots = 0;
  if (store_->layout().has_ring()) {
    const int64_t count = 1 + int64_t(a.publish_at.size()) +
                          (options_.snapshot_every > 0
                               ? prompt / options_.snapshot_every +
                                     kSnapshotsPerStart * int64_t(a.request.message_starts.size())
                               : 0);
    snapshots = count * store_->peak_bytes_at_length(0);
  }
  return int64_t(a.request.n) * store_->peak_bytes_at_length(length) + snapshots;
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
  while (reserved + need + cached_bytes() > options_.kv_budget &&
         (!cached_.empty() || !saved_.empty()))
    evict_lru();
  return reserved + need <= options_.kv_budget;
}

bool Engine::attach(Generation &a) {
  const std::vector<int32_t> &prompt = a.request.prompt;
  // A scored prompt needs every position's logits: nothing of it is reused.
  if (!options_.prefix_reuse || tree_.n_sequences() == 0 || a.request.prompt_logprobs) return false;
  // At least the prompt's last token is computed (its logits start the answer), unless a snapshot
  // at the prompt's end kept them: the same prompt again (a regenerate) computes nothing.
  const int32_t whole = int32_t(prompt.size()), target = whole - 1;
  PrefixTree::Match m = tree_.match(prompt, whole);
  if (m.sequences.empty()) return false;
  const bool whole_prompt = m.snapshot && m.snapshot_depth == whole && m.restore_depth == whole &&
                            !saved_.at(*m.snapshot).logits.empty();
  if (!whole_prompt) m = tree_.match(prompt, target); // the deepest snapshot short of the end
  // The deepest point a cached sequence's rings still hold (every position for a model without
  // sliding layers): forking there costs no snapshot.
  kv::SeqId fork_from = -1;
  int32_t fork_at = 0;
  for (const auto &[s, c] : cached_) {
    const int32_t at =
        int32_t(std::min(shared_prefix(*tree_.tokens_of(s), prompt), size_t(target)));
    if (at > fork_at && at >= store_->sequence(s)->rewind_floor()) fork_from = s, fork_at = at;
  }
  int32_t reuse = 0;
  if (!whole_prompt && fork_at > 0 && fork_at >= m.restore_depth) {
    auto child = store_->fork(fork_from, fork_at);
    if (!child.ok()) return false;
    a.seq = *child, reuse = fork_at;
    cached_[fork_from].last_used = ++clock_;
    reuse_draft(a, fork_from, fork_at);
  } else if (m.snapshot) {
    Saved &saved = saved_.at(*m.snapshot);
    auto child = store_->fork_at_snapshot(m.snapshot_source, *saved.snapshot, m.restore_depth);
    if (!child.ok()) return false;
    a.seq = *child, reuse = m.restore_depth;
    reuse_draft(a, m.snapshot_source, m.restore_depth);
    saved.last_used = ++clock_;
    cached_[m.snapshot_source].last_used = clock_;
    ++stats_.snapshot_restores;
    if (whole_prompt) a.prompt_logits = saved.logits, a.logits_ready = true;
  }
  if (reuse == 0) return false;
  a.computed = size_t(reuse);
  a.reused = reuse;
  stats_.reused_prompt_tokens += reuse;
  ++stats_.prefix_hits;
  return true;
}

bool Engine::park(std::unique_ptr<Generation> &a) {
  if (!options_.prefix_reuse || options_.max_cached == 0 || a->request.prompt_logprobs)
    return false;
  const std::vector<int32_t> &prompt = a->request.prompt;
  // Worth waiting for: a prefix at least a page longer than what the tree gives now.
  const int32_t tree_depth = std::min(tree_.match(prompt, 0).depth, int32_t(prompt.size()) - 1);
  Generation *best = nullptr;
  int32_t best_depth = tree_depth + store_->page_rows() - 1;
  for (const auto &g : active_) {
    const int32_t shared =
        int32_t(std::min(shared_prefix(g->request.prompt, prompt), prompt.size() - 1));
    // Only a prefix it has yet to compute: one it holds is served by forking it when it is cached
    // (or by its snapshots).
    if (shared > best_depth && size_t(shared) > g->computed) best = g.get(), best_depth = shared;
  }
  if (!best) return false;
  best->publish_at.insert(best_depth);
  parked_.push_back({std::move(a), best->id, best_depth});
  ++stats_.parked;
  return true;
}

void Engine::unpark() {
  // Back to the queue's front in their order: they were first in line.
  for (auto it = parked_.rbegin(); it != parked_.rend();) {
    const bool producing = std::any_of(active_.begin(), active_.end(), [&](const auto &g) {
      return g->id == it->waits_for && g->choice == 0 && g->publish_at.count(it->depth);
    });
    if (producing) {
      ++it;
      continue;
    }
    queue_.push_front(std::move(it->g));
    it = decltype(it)(parked_.erase(std::next(it).base()));
  }
}

bool Engine::publish_prefix(Generation &a) {
  const int32_t depth = int32_t(a.computed);
  if (!a.publish_at.erase(depth)) return false;
  // A fork at this depth, cached, serves the waiting requests (its rings hold the depth); a
  // snapshot there, in the tree at once, serves later ones after the fork is gone (a longer
  // sequence through it makes it redundant).
  const std::span<const int32_t> prefix(a.tokens.data(), size_t(depth));
  auto fork = store_->fork(a.seq, depth);
  if (!fork.ok()) return false;
  if (!tree_.insert_sequence(prefix, *fork)) {
    (void)store_->remove_sequence(*fork);
    return false;
  }
  cached_[*fork] = {++clock_, depth};
  if (store_->layout().has_ring())
    if (auto snap = store_->snapshot(a.seq, options_.snapshot_reach); snap.ok())
      keep_snapshot(prefix, std::move(snap).value(), {});
  return true;
}

void Engine::keep_snapshot(std::span<const int32_t> prefix, std::unique_ptr<kv::Snapshot> snapshot,
                           std::vector<float> logits) {
  const int32_t reach = snapshot->reach();
  // The same state taken again keeps the snapshot that reaches further back (a sequence forked
  // just before this depth saved fewer rows), and a prompt end's logits.
  if (auto old = tree_.snapshot_at(prefix); old && old->second >= reach) {
    Saved &kept = saved_.at(old->first);
    if (kept.logits.empty()) kept.logits = std::move(logits);
    kept.last_used = clock_;
    return;
  }
  const PrefixTree::SnapshotId id = next_snapshot_++;
  std::optional<PrefixTree::SnapshotId> replaced;
  if (!tree_.insert_snapshot(prefix, id, reach, &replaced)) return; // on no cached sequence's path
  if (replaced) {
    if (logits.empty()) logits = std::move(saved_.at(*replaced).logits);
    saved_.erase(*replaced);
  }
  saved_[id] = Saved{std::move(snapshot), std::move(logits), clock_};
}

Status Engine::admit(Generation &a) {
  a.tokens = a.request.prompt;
  a.computed = 0;
  start_speculation(a);
  // Sequences in the store: the active ones, the cached ones, and the one this request adds.
  while (int32_t(active_.size() + cached_.size()) >= options_.max_active + options_.max_cached &&
         !cached_.empty())
    evict_lru(true);
  if (attach(a)) return ok_status();
  for (;;) {
    auto seq = store_->create_sequence();
    if (seq.ok()) {
      a.seq = *seq;
      return ok_status();
    }
    if (cached_.empty() && saved_.empty()) return seq.status();
    evict_lru(); // make room: the least recently used cached state goes first
  }
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
  if (a.choice == 0 && !a.spawned)
    for (int32_t c = 1; c < a.request.n; ++c) {
      e.choice = c;
      a.on_event(e);
    }
}

bool Engine::cache_sequence(Generation &a) {
  if (options_.max_cached == 0 || !options_.prefix_reuse || a.computed == 0) return false;
  const std::span<const int32_t> held(a.tokens.data(), a.computed);
  // Cached sequences that this one holds add nothing but their rings' slack: a prefix of it or the
  // same tokens, and those whose own prompt this one extends (what they add is the answer they
  // generated, which the next turn of their conversation replaced: a chat template re-renders it).
  // Their prompt ends' snapshots lie on this one's path and stay.
  // (A follow-up message leaves the prompt inside its generation header, a token or two before
  // its end: that sequence stays until evicted. Its prompt end's snapshot reaches the new path, but
  // nothing tells a continuation from a conversation that differs only near its prompt end.)
  std::vector<kv::SeqId> redundant;
  for (const auto &[s, c] : cached_) {
    const std::vector<int32_t> &t = *tree_.tokens_of(s);
    const size_t shared = shared_prefix(t, held);
    if (shared == t.size() || shared >= size_t(c.prompt)) redundant.push_back(s);
  }
  if (!tree_.insert_sequence(held, a.seq)) return false;
  cached_[a.seq] = {++clock_, int32_t(std::min(a.computed, a.request.prompt.size()))};
  for (Generation::Taken &t : a.taken) {
    if (size_t(t.depth) <= a.computed)
      keep_snapshot(held.first(size_t(t.depth)), std::move(t.snapshot), std::move(t.logits));
  }
  a.taken.clear();
  for (kv::SeqId s : redundant) drop_cached(s);
  return true;
}

void Engine::finish(Generation &a, FinishReason reason, const std::string &error) {
  end_events(a, reason, error);
  // Keep what the sequence holds for prefix reuse; the least recently used goes first. Either
  // way the generation no longer owns it (it stays in active_ until the step settles). A verify
  // span's rejected rows go first; where they cannot, the sequence is not kept.
  const bool cached = drop_rejected(a).ok() && cache_sequence(a);
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
    if (park(a)) {
      ++waiting_; // still waiting, beside the queue
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
    if (a->request.n > 1 && a->request.max_tokens > 0) spawn_choices(*a, logits, born);
    if (!advance(*a, logits)) done.push_back(a.get());
  }
  settle(done, std::move(born));
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
  int32_t budget = options_.step_tokens;
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
    if (scored) n = std::min(n, kScoredChunk);
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
    batch.spans.push_back({p.g->seq, int32_t(p.g->computed), p.n});
    first_row[i] = batch.logit_rows.size();
    if (p.all_rows || !p.draft.empty())
      for (int32_t j = 0; j < p.n; ++j) batch.logit_rows.push_back(first + j);
    else if (p.wants_logits)
      batch.logit_rows.push_back(first + p.n - 1);
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
  // A decode step's cost for the adaptive draft length: the forward pass alone (what follows it
  // is paid per token kept, as plain decoding pays it).
  if (prefill_tokens == 0 && logits.ok()) step_cost_.observe(int32_t(batch.tokens.size()), seconds);
  if (!logits.ok()) {
    // Nothing was committed; the requests of this step end with the reason, the others go on
    // (a request cancelled meanwhile is finished by the next step, not dropped here).
    std::vector<Generation *> failed;
    for (const Part &p : parts)
      failed.push_back(p.g), finish(*p.g, FinishReason::Error, logits.message());
    settle(failed);
    return;
  }
  const size_t n_vocab = size_t(model_.config().n_vocab);
  std::vector<Generation *> done;
  std::vector<std::unique_ptr<Generation>> born;
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
    int32_t start =
        prefill && every > 0 ? message_start_near(a, a.computed - size_t(p.n), a.computed) : -1;
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
      // edited message). The chunks near a start cover snapshot_reach either side of it between
      // them: the one ending just before it reaches over its side, the one holding it back from
      // its end to max_write before, the one just after it over the start. Chunks are not cut
      // for this: message starts change no chunk boundary, hence no float rounding.
      const int32_t reach =
          std::max(options_.snapshot_reach,
                   start >= 0 ? int32_t(a.computed) - start + options_.snapshot_reach : 0);
      if (auto snap = store_->snapshot(a.seq, reach); snap.ok())
        a.taken.push_back(
            {int32_t(a.computed), std::move(snap).value(), std::vector<float>(l.begin(), l.end())});
    }
    if (!p.wants_logits) continue;
    // (A prompt scored without an answer ends every choice at once: nothing to fork.)
    if (prefill && a.request.n > 1 && a.request.max_tokens > 0) spawn_choices(a, l, born);
    if (!advance(a, l)) done.push_back(&a);
  }
  settle(done, std::move(born));
}

bool Engine::advance(Generation &a, std::span<const float> logits, int32_t *drawn, int32_t drafted,
                     int32_t chosen) {
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
  if (a.grammar && !a.grammar->accept_token(*token)) { // the mask allowed it: our bug
    finish(a, FinishReason::Error, "internal: the grammar refused a token its mask allowed");
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
  e.request = a.id, e.token = *token, e.choice = a.choice;
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
    child->prompt_logprobs = a.prompt_logprobs;
    child->computed = a.request.prompt.size();
    sample::SamplingParams sp = a.request.sampling;
    sp.seed += uint64_t(c);
    auto sampler = sample::Sampler::create(sp, model_.config().n_vocab);
    auto seq = store_->fork(a.seq, int32_t(a.computed)); // the prompt, computed once
    if (!sampler.ok() || !seq.ok()) {
      Event e;
      e.request = a.id, e.finish = FinishReason::Error, e.choice = c;
      e.error = !seq.ok() ? seq.message() : sampler.message();
      if (a.on_event) a.on_event(e);
      if (seq.ok()) (void)store_->remove_sequence(*seq);
      continue;
    }
    child->sampler = std::move(sampler).value();
    child->seq = *seq;
    if (a.request.grammar) child->grammar.emplace(a.request.grammar);
    child->speculator = a.speculator; // its history: the prompt
    if (advance(*child, logits)) born.push_back(std::move(child));
  }
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

} // namespace offgraph::engine
