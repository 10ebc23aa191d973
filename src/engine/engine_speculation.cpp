// Engine: speculative decoding's part of the step loop (docs/speculative.md): starting a
// sequence's drafter, the draft model's passes and its cache, and the verification of a span.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>

namespace offgraph::engine {

void Engine::start_speculation(Generation &a) {
  SpeculationOptions o = a.request.speculation.value_or(options_.speculation);
  // A prediction is drafted from by n-gram drafts (submit() refused one with another source).
  if (!a.request.prediction.empty()) o.source = DraftSource::Ngram;
  // A draft model has no image rows (submit() refused a request that asks for one).
  if (o.source == DraftSource::Draft && !a.request.embeddings.empty()) return;
  if (o.source != DraftSource::None && a.request.max_tokens > 1)
    a.speculator.emplace(o, a.request.prediction, a.tokens,
                         recent_acceptance_[size_t(o.source)].rate());
}

std::vector<std::vector<int32_t>>
Engine::draft_with_model(const std::vector<std::pair<Generation *, int32_t>> &want) {
  std::vector<std::vector<int32_t>> out(want.size());
  const size_t m = size_t(options_.max_write);
  for (const auto &[a, k] : want) {
    // The draft cache never holds more than the kept tokens before the last one (sync_draft).
    if (a->draft_seq >= 0 && a->draft_len >= a->tokens.size()) drop_draft(*a);
    if (a->draft_seq >= 0) continue;
    auto seq = draft_store_->create_sequence();
    // Past the draft store's budget the cached conversations' drafts give way first.
    while (!seq.ok() && !cached_drafts_.empty()) {
      (void)draft_store_->remove_sequence(cached_drafts_.begin()->second.first);
      cached_drafts_.erase(cached_drafts_.begin());
      seq = draft_store_->create_sequence();
    }
    if (!seq.ok()) return out; // nothing drafted this step
    a->draft_seq = *seq, a->draft_len = 0;
  }
  // Timed, and run: a forward pass of the draft model over `b`; false on failure (nothing kept).
  auto run = [&](model::Batch &b, bool drafting) -> std::optional<std::vector<float>> {
    const auto t0 = std::chrono::steady_clock::now();
    auto logits = draft_forward_->run(b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Drafting is part of decoding's time (decode tokens/s counts it).
    ++stats_.draft_steps, stats_.draft_seconds += s, stats_.decode_seconds += s;
    if (drafting)
      draft_step_seconds_ = draft_step_seconds_ > 0 ? 0.9 * draft_step_seconds_ + 0.1 * s : s;
    if (!logits.ok()) return std::nullopt;
    return std::move(logits).value();
  };
  // A failed pass leaves the draft caches of `want` unknown: they are dropped (started again from
  // nothing at the next draft), and nothing is drafted this step.
  auto failed = [&] {
    for (const auto &[a, k] : want) drop_draft(*a);
    return std::vector<std::vector<int32_t>>(want.size());
  };
  // Catch-up: each draft cache brought to within max_write tokens of its generation's tokens.
  for (;;) {
    model::Batch b;
    std::vector<Generation *> fed;
    for (const auto &[a, k] : want) {
      if (a->tokens.size() - a->draft_len <= m) continue;
      const auto from = a->tokens.begin() + long(a->draft_len);
      b.tokens.insert(b.tokens.end(), from, from + long(m));
      b.spans.push_back({a->draft_seq, int32_t(a->draft_len), int32_t(m)});
      fed.push_back(a);
    }
    if (fed.empty()) break;
    // No logit rows: the pass only fills the draft cache.
    if (!run(b, false)) return failed();
    for (Generation *a : fed) a->draft_len += m;
    stats_.draft_catch_up_tokens += int64_t(fed.size() * m);
  }
  // Drafting: the first step feeds what the cache lacks up to the last token, each next one the
  // token the step before drafted; each takes the argmax of its last row.
  const size_t n_vocab = size_t(model_.config().n_vocab);
  std::vector<bool> done(want.size(), false);
  for (;;) {
    model::Batch b;
    std::vector<size_t> fed;
    for (size_t i = 0; i < want.size(); ++i) {
      Generation &a = *want[i].first;
      if (done[i] || int32_t(out[i].size()) >= want[i].second) continue;
      const size_t before = b.tokens.size();
      if (out[i].empty()) {
        b.tokens.insert(b.tokens.end(), a.tokens.begin() + long(a.draft_len), a.tokens.end());
        stats_.draft_catch_up_tokens += int64_t(a.tokens.size() - a.draft_len) - 1;
      } else
        b.tokens.push_back(out[i].back());
      const int32_t n = int32_t(b.tokens.size() - before);
      b.spans.push_back({a.draft_seq, int32_t(a.draft_len), n});
      b.logit_rows.push_back(int32_t(b.tokens.size()) - 1);
      fed.push_back(i);
    }
    if (fed.empty()) break;
    auto logits = run(b, true);
    if (!logits) return failed();
    for (size_t r = 0; r < fed.size(); ++r) {
      const size_t i = fed[r];
      Generation &a = *want[i].first;
      a.draft_len += size_t(b.spans[r].n_tokens);
      const std::span<const float> row(logits->data() + r * n_vocab, n_vocab);
      const int32_t token =
          speculative_sampling(a) ? draw_draft(a, row, out[i]) : sample::argmax(row);
      if (token < 0) {
        done[i] = true; // no distribution to draw from: the draft ends here
        continue;
      }
      out[i].push_back(token);
    }
  }
  return out;
}

int32_t Engine::draw_draft(Generation &a, std::span<const float> row,
                           const std::vector<int32_t> &drafted) {
  if (drafted.empty()) a.draft_q_used = 0;
  if (!a.draft_sampler) {
    // q: the request's own sampling settings on the draft's logits, drawn with a stream of its
    // own (the target's stream decides acceptances and corrections).
    sample::SamplingParams params = a.request.sampling;
    params.seed = (params.seed + uint64_t(a.choice)) ^ 0xD1B54A32D192ED03ull; // choice c: seed + c
    auto s = sample::Sampler::create(params, model_.config().n_vocab);
    if (!s.ok()) return -1;
    a.draft_sampler.emplace(std::move(s).value());
  }
  const size_t n = a.tokens.size();
  a.tokens.insert(a.tokens.end(), drafted.begin(), drafted.end());
  if (a.draft_q.size() == a.draft_q_used) a.draft_q.emplace_back(); // rows are reused
  std::vector<double> &q = a.draft_q[a.draft_q_used];
  const Status s = a.draft_sampler->distribution(row, a.tokens, q);
  a.tokens.resize(n);
  if (!s.ok()) return -1;
  const int32_t token = a.draft_sampler->draw_from(q);
  if (token >= 0) ++a.draft_q_used;
  return token;
}

Result<sample::SpeculativeVerdict> Engine::pq_verdict(Generation &a, const float *rows,
                                                      const std::vector<int32_t> &draft) {
  // p_j: the request's sampling distribution at row j, its penalties reading the history with
  // d_1..d_j appended (the drafts are put on the tokens for that, then taken off).
  const size_t n_vocab = size_t(model_.config().n_vocab), n = a.tokens.size();
  std::vector<std::vector<double>> &p = pq_scratch_; // reused: vocabulary-sized rows
  if (p.size() < draft.size() + 1) p.resize(draft.size() + 1);
  a.tokens.insert(a.tokens.end(), draft.begin(), draft.end());
  Status s = ok_status();
  for (size_t j = 0; j <= draft.size() && s.ok(); ++j)
    s = a.sampler->distribution({rows + j * n_vocab, n_vocab}, {a.tokens.data(), n + j}, p[j]);
  a.tokens.resize(n);
  if (!s.ok()) return s;
  const sample::SpeculativeVerdict v = sample::verify_sampled(
      draft, std::span(p).first(draft.size() + 1), std::span(a.draft_q).first(a.draft_q_used),
      [&] { return a.sampler->uniform(); });
  if (v.next < 0) return Status::error("sampling: no token has weight after the draft");
  return v;
}

void Engine::sync_draft(Generation &a) {
  if (a.draft_seq < 0 || a.draft_len <= a.computed) return;
  if (draft_store_->rewind(a.draft_seq, int32_t(a.computed)).ok())
    a.draft_len = a.computed;
  else
    drop_draft(a); // started again from scratch at the next draft
}

void Engine::reuse_draft(Generation &a, kv::SeqId from, int32_t depth) {
  if (!a.speculator || a.speculator->options().source != DraftSource::Draft) return;
  auto d = cached_drafts_.find(from);
  if (d == cached_drafts_.end()) return;
  const int32_t at = std::min<int32_t>(depth, int32_t(d->second.second));
  // Refused where the draft's rings no longer hold the window before `at`: it then catches up.
  if (auto child = draft_store_->fork(d->second.first, at); child.ok())
    a.draft_seq = *child, a.draft_len = size_t(at);
}

void Engine::drop_draft(Generation &a) {
  if (a.draft_seq >= 0) (void)draft_store_->remove_sequence(a.draft_seq);
  a.draft_seq = -1, a.draft_len = 0;
}

bool Engine::speculative_sampling(const Generation &a) const {
  return a.speculator && a.speculator->options().source == DraftSource::Draft &&
         a.speculator->options().pq && a.request.sampling.temperature > 0 && !a.grammar;
}

bool Engine::verify(Generation &a, const float *rows, const std::vector<int32_t> &draft) {
  const size_t n_vocab = size_t(model_.config().n_vocab);
  a.computed += 1; // the token before the draft
  const int32_t k = int32_t(draft.size());
  // advance() counts the drafted tokens compared with the token drawn, and the ones equal, so that
  // a last event sent from inside the span reports them.
  a.span_tested = a.span_kept = 0;
  bool going = true;
  // Speculative sampling (a sampled draft model's draft, with its q): which tokens to emit.
  std::optional<sample::SpeculativeVerdict> verdict;
  if (speculative_sampling(a) && a.draft_q_used == draft.size()) {
    auto v = pq_verdict(a, rows, draft);
    if (!v.ok()) {
      finish(a, FinishReason::Error, v.message());
      return false;
    }
    verdict = *v;
  }
  // Row j follows the token before the draft and d_1..d_j: it is the sequence's own next-token
  // distribution for as long as every drafted token before it was the token emitted.
  for (int32_t j = 0; j <= k; ++j) {
    int32_t drawn = -1;
    const int32_t expected = j < k ? draft[size_t(j)] : -1;
    const int32_t chosen = !verdict ? -1 : size_t(j) < verdict->accepted ? expected : verdict->next;
    going = advance(a, {rows + size_t(j) * n_vocab, n_vocab}, &drawn, expected, chosen);
    if (!going || drawn != expected || (verdict && size_t(j) >= verdict->accepted))
      break;         // finished (finish() dropped the rows past it), a miss, or p/q's last token
    a.computed += 1; // d_{j+1} was kept: its row in the cache is the sequence's
  }
  const int32_t tested = a.span_tested, kept = a.span_kept;
  // A request that finished inside the span verified only the drafted tokens up to there.
  const int32_t drafted = going ? k : tested;
  a.span_tested = a.span_kept = 0;
  const bool model_draft = a.speculator->options().source == DraftSource::Draft;
  DraftStats &s = model_draft ? stats_.draft : stats_.ngram;
  ++s.verifications;
  s.drafted += drafted;
  s.accepted += kept;
  ++s.kept[size_t(std::min<int32_t>(kept, int32_t(s.kept.size()) - 1))];
  a.drafted += drafted, a.accepted += kept;
  a.speculator->observe(tested, kept);
  recent_acceptance_[size_t(a.speculator->options().source)].observe(tested, kept);
  if (model_draft) sync_draft(a);
  if (!going) return false;
  if (Status st = drop_rejected(a); !st.ok()) {
    finish(a, FinishReason::Error, "internal: " + st.message());
    return false;
  }
  return true;
}

Status Engine::drop_rejected(Generation &a) {
  const cache::Sequence *seq = store_->sequence(a.seq);
  if (seq == nullptr || seq->length() <= int32_t(a.computed)) return ok_status();
  return store_->rewind(a.seq, int32_t(a.computed));
}

} // namespace offgraph::engine
