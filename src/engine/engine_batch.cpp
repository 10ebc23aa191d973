// Engine: a step's batch (docs/prefix-cache.md, docs/speculative.md): each generation's next
// tokens under the step's budget (decodes, verify spans, prefill chunks), one forward pass over
// them, and what each part's logits do; a batch whose graph cannot be allocated runs smaller
// (docs/reliability.md, "Faults contained to their request").
#include "engine/engine.h"

#include "engine/engine_detail.h"

#include <algorithm>
#include <chrono>

namespace offgraph::engine {
namespace {

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
} // namespace

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
  int32_t budget = allocatable_.cap(options_.step_tokens);
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
        const int32_t limit = std::min({store_->sequence(a->seq)->max_draft_tokens(),
                                        a->request.max_tokens - a->generated - 1,
                                        budget - 1 - later, a->span.cap(options_.max_write) - 1});
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
    size_t n = std::min<size_t>({size_t(a->span.cap(options_.max_write)), size_t(budget),
                                 a->request.prompt.size() - a->computed});
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
  // A part alone: its own span sizes learn (the steps' do not).
  if (parts.size() == 1 && !logits.ok() && forward_->allocation_failed())
    parts[0].g->span.failed(parts[0].n);
  else if (logits.ok())
    for (const Part &p : parts) p.g->span.ran(p.n, options_.max_write);
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

} // namespace offgraph::engine
