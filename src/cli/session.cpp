#include "session.h"

#include "ggml-cpu.h"

#include <algorithm>

namespace offgraph::cli {

Result<std::unique_ptr<Session>> Session::create(const model::Model &model,
                                                 SessionOptions options) {
  std::unique_ptr<Session> s(new Session(model, options));
  options.max_write = std::min(options.max_write, options.ctx);
  s->options_ = options;
  auto layout = model::make_layout(model, {options.ctx, options.max_write});
  if (!layout.ok()) return layout.status();
  auto store = kv::KvStore::create(*layout, options.types, ggml_backend_cpu_buffer_type());
  if (!store.ok()) return store.status();
  s->store_ = std::move(store).value();
  auto seq = s->store_->create_sequence();
  if (!seq.ok()) return seq.status();
  s->seq_ = *seq;
  s->forward_ = std::make_unique<model::Forward>(model, *s->store_, options.threads);
  return s;
}

void Session::reset() {
  store_->sequence(seq_)->clear();
  tokens_.clear();
  snapshots_.clear();
}

int32_t Session::rewind_to(int32_t length) {
  cache::Sequence &seq = *store_->sequence(seq_);
  if (seq.rewind(length).ok()) return length;
  // The rings have moved past `length`: the latest snapshot at or before it brings them back.
  for (auto it = snapshots_.rbegin(); it != snapshots_.rend(); ++it)
    if ((*it)->length() <= length && store_->restore(seq_, **it).ok()) return (*it)->length();
  seq.clear();
  return 0;
}

Result<std::vector<float>> Session::compute(const std::vector<int32_t> &tokens, size_t from) {
  std::vector<float> logits;
  for (size_t at = from; at < tokens.size();) {
    const int32_t n = int32_t(std::min<size_t>(size_t(options_.max_write), tokens.size() - at));
    model::Batch b;
    b.tokens.assign(tokens.begin() + long(at), tokens.begin() + long(at) + n);
    b.spans.push_back({seq_, int32_t(at), n});
    b.logit_rows = {n - 1};
    auto l = forward_->run(b);
    if (!l.ok()) return l.status();
    logits = std::move(l).value();
    at += size_t(n);
  }
  return logits;
}

Result<std::vector<float>> Session::prompt(const std::vector<int32_t> &prompt) {
  if (prompt.empty()) return Status::error("the prompt is empty");
  if (int64_t(prompt.size()) >= options_.ctx)
    return Status::error("the prompt has " + std::to_string(prompt.size()) +
                         " tokens; the context holds " + std::to_string(options_.ctx) +
                         " (use --ctx)");
  const auto t0 = std::chrono::steady_clock::now();
  size_t common = 0;
  while (common < tokens_.size() && common < prompt.size() && tokens_[common] == prompt[common])
    ++common;
  common = std::min(common, prompt.size() - 1); // the last token is recomputed for fresh logits
  const int32_t kept = rewind_to(int32_t(common));
  tokens_.assign(prompt.begin(), prompt.end());
  auto logits = compute(tokens_, size_t(kept));
  if (!logits.ok()) {
    reset();
    return logits.status();
  }
  stats_.reused_tokens += kept;
  stats_.prompt_tokens += int64_t(prompt.size()) - kept;
  stats_.prompt_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A snapshot at every prompt's end; drop those the new history made stale.
  std::erase_if(snapshots_, [&](const auto &s) { return s->length() > kept; });
  if (auto snap = store_->snapshot(seq_); snap.ok()) {
    snapshots_.push_back(std::move(snap).value());
    if (snapshots_.size() > options_.max_snapshots) snapshots_.erase(snapshots_.begin());
  }
  return logits;
}

Result<std::vector<float>> Session::step(int32_t token) {
  if (int32_t(tokens_.size()) + 1 > options_.ctx)
    return Status::error("the context of " + std::to_string(options_.ctx) + " tokens is full");
  const auto t0 = std::chrono::steady_clock::now();
  tokens_.push_back(token);
  auto logits = compute(tokens_, tokens_.size() - 1);
  if (!logits.ok()) {
    tokens_.pop_back();
    return logits.status();
  }
  ++stats_.generated_tokens;
  stats_.generate_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return logits;
}

} // namespace offgraph::cli
