// Engine: memory and the prefix cache (docs/prefix-cache.md): what cached sequences and
// snapshots hold, eviction under the budgets, admission by the most a request can grow to, and
// starting a request from the deepest reusable point (attach, park, publish, keep a snapshot).
#include "base/units.h"
#include "engine/engine.h"
#include "engine/engine_detail.h"
#include "kv/step.h"
#include "model/weight_memory.h"

#include "ggml-backend.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>

namespace offgraph::engine {

int64_t kv_budget_from_memory(std::span<const KvDeviceMemory> devices, int64_t pool, int64_t one) {
  // The budget B puts at most B * part on a device: at most held + 3/4 of what it may take.
  std::optional<int64_t> budget;
  for (const KvDeviceMemory &d : devices) {
    if (d.available <= 0 || d.part <= 0) continue; // unknown, or nothing of the KV there
    const double room = double(d.held) + double(d.available / 4 * 3);
    // (A part past 1: a draft model's store beside the target's on that device.)
    const int64_t limit = int64_t(std::min(room / d.part, 0x1p62));
    budget = budget ? std::min(*budget, limit) : limit;
  }
  if (!budget) return 0; // unknown: no limit, as before there was a default
  if (pool > 0) budget = std::min(*budget, pool);
  return std::max(*budget, std::max<int64_t>(one, 1));
}

int64_t compute_budget_from_memory(int64_t available, int64_t one_token) {
  if (available <= 0) return 0;
  return std::max(available / 8, std::max<int64_t>(one_token, 1));
}

namespace {

// What a device may still take: the host's memory available (model::available_memory(), once
// the weights are in), another device's free memory; 0: unknown.
int64_t device_available(ggml_backend_buffer_type_t buft) {
  if (!kv::is_device_storage(buft)) return int64_t(model::available_memory());
  if (ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft)) {
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(dev, &free, &total);
    return int64_t(free);
  }
  return 0;
}

// The compute buffers passes of `sizes` tokens (descending) at the deepest position of the
// context need, by buffer type: measured (model::Forward::measure) on one sequence of the store
// advanced there (to each size's depth in turn) without computing anything, and removed after.
// Its storage is only reserved (host pages are never touched; a device's pool is allocated
// already), past the store's budget for the while; where the pool cannot hold that deep a
// sequence, at the deepest it can hold.
Result<std::vector<kv::BytesByBufferType>> deepest_step_needs(model::Forward &forward,
                                                              kv::KvStore &store, int32_t context,
                                                              int32_t max_write,
                                                              const std::vector<int32_t> &sizes) {
  auto seq = store.create_sequence();
  if (!seq.ok()) return seq.status();
  const int64_t budget = store.memory_budget();
  store.set_memory_budget(0);
  std::string measuring;
  auto measured = [&]() -> Result<std::vector<kv::BytesByBufferType>> {
    std::vector<kv::BytesByBufferType> out;
    int32_t at = 0;
    bool full = false; // the pool holds no more
    for (const int32_t n : sizes) {
      measuring = "a step of " + std::to_string(n) + " token(s) at the full context";
      while (!full && at < context - n) {
        const int32_t chunk = std::min(max_write, context - n - at);
        kv::Step step(store);
        if (auto span = step.add_span({*seq, at, chunk}); !span.ok()) {
          if (span.status().code() != StatusCode::kResourceExhausted || at < n)
            return span.status();
          full = true;
          break;
        }
        OFFGRAPH_TRY(step.commit());
        at += chunk;
      }
      model::Batch batch;
      batch.tokens.assign(size_t(n), 0);
      batch.spans.push_back({*seq, at, n});
      batch.logit_rows.push_back(n - 1);
      auto needs = forward.measure(batch);
      if (!needs.ok()) return needs.status();
      out.push_back(std::move(needs).value());
    }
    return out;
  };
  Result<std::vector<kv::BytesByBufferType>> needs = Status();
  try {
    needs = measured();
  } catch (const std::bad_alloc &) {
    needs = Status::error("out of memory", StatusCode::kResourceExhausted);
  }
  store.set_memory_budget(budget);
  (void)store.remove_sequence(*seq);
  if (!needs.ok()) return Status::error("measuring " + measuring + ": " + needs.message());
  return needs;
}

// Each buffer type's largest part of the store's bytes (KvDeviceMemory::part).
std::vector<std::pair<ggml_backend_buffer_type_t, double>> device_parts(const kv::KvStore &store,
                                                                        int32_t context) {
  std::vector<std::pair<ggml_backend_buffer_type_t, double>> parts;
  for (const int32_t length : {0, context}) {
    const kv::BytesByBufferType by = store.peak_bytes_at_length_by_buffer_type(length);
    int64_t whole = 0;
    for (const auto &[buft, bytes] : by) whole += bytes;
    for (const auto &[buft, bytes] : by) {
      const double part = whole > 0 ? double(bytes) / double(whole) : 0.0;
      auto it = std::find_if(parts.begin(), parts.end(),
                             [b = buft](const auto &p) { return p.first == b; });
      if (it == parts.end())
        parts.push_back({buft, part});
      else
        it->second = std::max(it->second, part);
    }
  }
  return parts;
}

} // namespace

std::vector<KvDeviceMemory> kv_device_memory(const kv::KvStore &store, int32_t context,
                                             const kv::KvStore *draft, double draft_share) {
  std::vector<std::pair<ggml_backend_buffer_type_t, KvDeviceMemory>> by;
  auto add = [&by, context](const kv::KvStore &s, double share) {
    const kv::BytesByBufferType held = s.device_pool_bytes();
    for (const auto &[buft, part] : device_parts(s, context)) {
      auto it =
          std::find_if(by.begin(), by.end(), [b = buft](const auto &d) { return d.first == b; });
      if (it == by.end()) {
        by.push_back({buft, {device_available(buft), 0, 0}});
        it = by.end() - 1;
      }
      it->second.part += part * share;
      it->second.held += kv::bytes_on(held, buft);
    }
  };
  add(store, 1.0);
  if (draft && draft_share > 0) add(*draft, draft_share);
  std::vector<KvDeviceMemory> out;
  for (const auto &[buft, d] : by) out.push_back(d);
  return out;
}

std::vector<Engine::Load::DeviceBytes>
budget_parts_by_device(const kv::KvStore &store, int32_t context, int64_t budget, const char *use) {
  std::vector<Engine::Load::DeviceBytes> out;
  if (budget <= 0) return out;
  for (const auto &[buft, part] : device_parts(store, context))
    out.push_back({buft, use, int64_t(double(budget) * part)});
  return out;
}

Status Engine::set_compute_budget() {
  if (options_.compute_budget == 0) return ok_status();
  const int32_t context = options_.context;
  const int32_t chunk = std::min(options_.max_write, options_.step_tokens);
  ComputeNeeds target, draft;
  for (auto [needs, forward, store] :
       {std::tuple{&target, forward_.get(), store_.get()},
        std::tuple{&draft, draft_forward_.get(), draft_store_.get()}}) {
    if (!forward) continue;
    auto measured =
        deepest_step_needs(*forward, *store, context, options_.max_write, {std::max(chunk, 1), 1});
    if (!measured.ok()) return measured.status();
    needs->full_chunk = std::move((*measured)[0]), needs->one_token = std::move((*measured)[1]);
  }
  compute_needs_ = target;
  for (const auto &[buft, bytes] : draft.one_token)
    kv::add_bytes(compute_needs_.one_token, buft, bytes);
  for (const auto &[buft, bytes] : draft.full_chunk)
    kv::add_bytes(compute_needs_.full_chunk, buft, bytes);
  kv::BytesByBufferType budget;
  for (const auto &[buft, one] : compute_needs_.one_token) {
    const int64_t b = options_.compute_budget > 0
                          ? options_.compute_budget
                          : compute_budget_from_memory(device_available(buft), one);
    if (b <= 0) continue; // unknown memory: no limit there
    if (b < one)
      return Status::error("the compute budget (--compute-mib) of " + mib(b) +
                           " cannot hold one token's step at the full context (-c " +
                           std::to_string(context) + ") on " + ggml_backend_buft_name(buft) +
                           ": it needs " + mib(one));
    kv::add_bytes(budget, buft, b);
    budget_by_device_.push_back({buft, "compute", b});
  }
  auto limit = [budget](ggml_backend_buffer_type_t buft) -> int64_t {
    for (const auto &[b, bytes] : budget)
      if (b == buft) return bytes;
    return -1;
  };
  // The target's passes may take what the draft's hold not; the draft's leave the target's
  // one-token step its room, so that a request can always take its next token.
  model::Forward *draft_forward = draft_forward_.get();
  forward_->set_compute_limit([limit, draft_forward](ggml_backend_buffer_type_t buft) -> int64_t {
    const int64_t b = limit(buft);
    if (b < 0 || !draft_forward) return b;
    return std::max<int64_t>(0, b - kv::bytes_on(draft_forward->compute_buffer_bytes(), buft));
  });
  if (draft_forward) {
    model::Forward *target_forward = forward_.get();
    draft_forward->set_compute_limit([limit, target_forward, one = target.one_token](
                                         ggml_backend_buffer_type_t buft) -> int64_t {
      const int64_t b = limit(buft);
      if (b < 0) return b;
      return std::max<int64_t>(
          0, b - std::max(kv::bytes_on(target_forward->compute_buffer_bytes(), buft),
                          kv::bytes_on(one, buft)));
    });
  }
  return ok_status();
}

int64_t Engine::cached_bytes() const {
  // Runs every step (publish) and in the eviction loops: the store counts the pages only kept
  // sequences hold as pages join and leave tables (kv::SeqRole), so this is O(sequences).
  int64_t bytes = int64_t(store_->kept_only_pages()) * store_->page_bytes();
  for (const auto &[seq, c] : cached_) bytes += store_->ring_bytes(seq);
  for (const auto &[id, saved] : saved_)
    bytes += saved.snapshot->bytes() + int64_t(saved.logits.size() * sizeof(float));
  return bytes;
}

int64_t Engine::cached_bytes_walked() const {
  // The same by walking the tables (what cached_bytes computed before the store counted roles):
  // marks in a flat array by page id. 1: an active request holds the page (it counts there); 2:
  // already counted here.
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
  evict_over_budget_minus(0);
}

void Engine::evict_over_budget_minus(int64_t reserve) {
  // Snapshots inside prompts (at message starts, periodic) on their own budget, less `reserve`,
  // the least recently used first; those at prompt ends (with their logits) go with their
  // conversations.
  const int64_t budget = snapshot_budget();
  if (budget < 0) return;
  int64_t held = snapshot_bytes();
  while (held + reserve > budget) {
    auto snap = saved_.end();
    for (auto it = saved_.begin(); it != saved_.end(); ++it)
      if (it->second.logits.empty() &&
          (snap == saved_.end() || it->second.last_used < snap->second.last_used))
        snap = it;
    if (snap == saved_.end()) break;
    held -= snap->second.snapshot->bytes();
    tree_.remove_snapshot(snap->first);
    saved_.erase(snap);
    ++stats_.snapshot_evictions;
  }
}

void Engine::trim_taken(Generation &a) {
  // A request's own snapshots inside its prompt count against the snapshot budget as they are
  // taken (a long prompt with many message starts would otherwise hold them all until it ends):
  // over it, the tree's go first, then the request's shallowest (the deeper ones are nearer the
  // turns an agent edits).
  const int64_t budget = snapshot_budget();
  if (budget < 0) return;
  int64_t own = 0;
  for (const Generation::Taken &t : a.taken)
    if (t.logits.empty()) own += t.snapshot->bytes();
  if (own + snapshot_bytes() <= budget) return;
  evict_over_budget_minus(own);
  while (own + snapshot_bytes() > budget) {
    auto it = std::find_if(a.taken.begin(), a.taken.end(),
                           [](const Generation::Taken &t) { return t.logits.empty(); });
    if (it == a.taken.end()) return;
    own -= it->snapshot->bytes();
    a.taken.erase(it);
  }
}

int64_t Engine::snapshot_budget() const {
  if (options_.snapshot_budget != 0) return options_.snapshot_budget;
  return store_->peak_bytes_at_length(options_.context);
}

int64_t Engine::snapshot_bytes() const {
  int64_t bytes = 0;
  for (const auto &[id, saved] : saved_)
    if (saved.logits.empty()) bytes += saved.snapshot->bytes();
  return bytes;
}

int64_t Engine::peak_bytes(const Generation &a) const {
  return peak_bytes(a.request, a.publish_at.size());
}

int64_t Engine::peak_kv_bytes(const Request &request) const { return peak_bytes(request, 0); }

int64_t Engine::peak_bytes(const Request &r, size_t shared_points) const {
  // Each choice may grow to the full length; the prompt keeps a snapshot at its end, one every
  // snapshot_every tokens and at most kSnapshotsPerStart per message start, and one where requests
  // wait to share it (each at most the rings).
  const int32_t prompt = int32_t(r.prompt.size());
  const int32_t length = prompt + r.max_tokens;
  int64_t snapshots = 0;
  if (store_->layout().has_ring()) {
    const int64_t starts = options_.snapshot_every > 0 || options_.start_snapshots
                               ? kSnapshotsPerStart * int64_t(r.message_starts.size())
                               : 0;
    const int64_t shared = int64_t(shared_points);
    const int64_t count =
        1 + shared + (options_.snapshot_every > 0 ? prompt / options_.snapshot_every : 0) + starts;
    // The prompt end's and the shared points' are needed; the others (message starts, periodic)
    // are kept within the snapshot budget, which bounds them (trim_taken).
    const int64_t per = store_->peak_bytes_at_length(0);
    const int64_t required = (1 + shared) * per;
    int64_t optional = (count - 1 - shared) * per;
    if (const int64_t budget = snapshot_budget(); budget >= 0)
      optional = std::min(optional, budget);
    if (!options_.prefix_reuse || options_.max_cached == 0) optional = 0; // none are taken
    snapshots = required + optional;
  }
  return int64_t(r.n) * store_->peak_bytes_at_length(length) + snapshots;
}

Status Engine::check_kv_budget(const Request &r, int64_t need) const {
  if (options_.kv_budget <= 0 || need <= options_.kv_budget) return ok_status();
  return Status::error("the request may need " + std::to_string(need) +
                       " bytes of KV cache (prompt + max_tokens" + (r.n > 1 ? ", times n" : "") +
                       "); the budget (--kv-mib) is " + std::to_string(options_.kv_budget));
}

Result<bool> Engine::memory_allows(const Generation &a) {
  if (options_.kv_budget <= 0) return true;
  const int64_t need = peak_bytes(a);
  if (Status s = check_kv_budget(a.request, need); !s.ok()) return s;
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

int32_t Engine::reusable_depth(const Generation &a, int32_t shared) {
  for (const Request::Embeddings &e : a.request.embeddings)
    if (e.at < shared && shared < e.at + e.rows->n_rows) return e.at;
  return shared;
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
  const int32_t trusted = reusable_depth(a, m.depth);
  const bool whole_prompt = trusted == whole && m.snapshot && m.snapshot_depth == whole &&
                            m.restore_depth == whole && !saved_.at(*m.snapshot).logits.empty();
  if (!whole_prompt) // the deepest snapshot short of the end
    m = tree_.match(prompt, std::min(target, trusted));
  // The deepest point a cached sequence's rings still hold (every position for a model without
  // sliding layers): forking there costs no snapshot.
  kv::SeqId fork_from = -1;
  int32_t fork_at = 0;
  for (const auto &[s, c] : cached_) {
    const int32_t at =
        std::min(reusable_depth(a, int32_t(shared_prefix(*tree_.tokens_of(s), prompt))), target);
    if (at > fork_at && at >= store_->sequence(s)->rewind_floor()) fork_from = s, fork_at = at;
  }
  int32_t reuse = 0;
  bool forked = false;
  if (!whole_prompt && fork_at > 0 && fork_at >= m.restore_depth) {
    // A fork that cannot be made (its rings' memory) falls back to the snapshot below, then to
    // computing the prompt.
    if (auto child = store_->fork(fork_from, fork_at); child.ok()) {
      a.seq = *child, reuse = fork_at, forked = true;
      store_->set_role(a.seq, kv::SeqRole::Active);
      cached_[fork_from].last_used = ++clock_;
      reuse_draft(a, fork_from, fork_at);
    } else {
      ++stats_.failed_forks;
    }
  }
  if (!forked && m.snapshot) {
    Saved &saved = saved_.at(*m.snapshot);
    auto child = store_->fork_at_snapshot(m.snapshot_source, *saved.snapshot, m.restore_depth);
    if (!child.ok()) return false;
    a.seq = *child, reuse = m.restore_depth;
    store_->set_role(a.seq, kv::SeqRole::Active);
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
  const int32_t tree_depth =
      std::min(reusable_depth(*a, tree_.match(prompt, 0).depth), int32_t(prompt.size()) - 1);
  Generation *best = nullptr;
  int32_t best_depth = tree_depth + store_->page_rows() - 1;
  for (const auto &g : active_) {
    const int32_t shared =
        std::min(reusable_depth(*a, int32_t(shared_prefix(g->request.prompt, prompt))),
                 int32_t(prompt.size()) - 1);
    // Only a prefix it has yet to compute: one it holds is served by forking it when it is cached
    // (or by its snapshots).
    if (shared > best_depth && size_t(shared) > g->computed) best = g.get(), best_depth = shared;
  }
  if (!best) return false;
  if (parked_.size() == parked_.capacity()) // what may throw, before `a` is moved
    parked_.reserve(2 * parked_.size() + 1);
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
  store_->set_role(*fork, kv::SeqRole::Kept);
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
      store_->set_role(a.seq, kv::SeqRole::Active);
      return ok_status();
    }
    if (cached_.empty() && saved_.empty()) return seq.status();
    evict_lru(); // make room: the least recently used cached state goes first
  }
}

bool Engine::cache_sequence(Generation &a) {
  if (options_.max_cached == 0 || !options_.prefix_reuse || a.computed == 0 || a.rows_unknown)
    return false;
  const std::span<const int32_t> held(a.tokens.data(), a.computed);
  // Cached sequences that this one holds add nothing but their rings' slack: a prefix of it or the
  // same tokens, and those whose own prompt this one extends (what they add is the answer they
  // generated, which the next turn of their conversation replaced: a chat template re-renders it).
  // Their prompt ends' snapshots lie on this one's path and stay.
  // (A follow-up message leaves the prompt inside its generation header, a token or two before
  // its end: that sequence stays until evicted. Its prompt end's snapshot reaches the new path, but
  // nothing tells a continuation from a conversation that differs only near its prompt end.)
  // Another choice of the same request is not replaced: its answer is one the client may take
  // the conversation on from (n > 1 offers the choices to pick from).
  std::vector<kv::SeqId> redundant;
  for (const auto &[s, c] : cached_) {
    const std::vector<int32_t> &t = *tree_.tokens_of(s);
    const size_t shared = shared_prefix(t, held);
    if (shared == t.size() || (shared >= size_t(c.prompt) && c.request != a.id))
      redundant.push_back(s);
  }
  if (!tree_.insert_sequence(held, a.seq)) return false;
  cached_[a.seq] = {++clock_, int32_t(std::min(a.computed, a.request.prompt.size())), a.id};
  store_->set_role(a.seq, kv::SeqRole::Kept);
  for (Generation::Taken &t : a.taken) {
    if (size_t(t.depth) <= a.computed)
      keep_snapshot(held.first(size_t(t.depth)), std::move(t.snapshot), std::move(t.logits));
  }
  a.taken.clear();
  for (kv::SeqId s : redundant) drop_cached(s);
  return true;
}

} // namespace offgraph::engine
