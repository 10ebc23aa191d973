#include "engine/ngram_drafter.h"

#include <algorithm>
#include <cassert>

namespace offgraph::engine {

NgramDrafter::NgramDrafter(Options options) : options_(options) {
  options_.n_min = std::max(1, options_.n_min);
  options_.n_max = std::max(options_.n_min, options_.n_max);
  options_.max_candidates = std::max(1, options_.max_candidates);
}

uint64_t ngram_key(std::span<const int32_t> ngram) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (int32_t t : ngram) {
    h ^= uint64_t(uint32_t(t)) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
  }
  return h;
}

int32_t matching_tail(std::span<const int32_t> a, std::span<const int32_t> b, int32_t max) {
  int32_t length = 0;
  while (length < max && size_t(length) < a.size() && size_t(length) < b.size() &&
         a[a.size() - 1 - size_t(length)] == b[b.size() - 1 - size_t(length)])
    ++length;
  return length;
}

// draft() compares the tokens of every candidate, so a hash collision never makes a wrong draft;
// it takes one of the max_candidates links, which may then miss an older true occurrence.
uint64_t NgramDrafter::key_ending_at(size_t end) const {
  return ngram_key(
      std::span(tokens_).subspan(end + 1 - size_t(options_.n_min), size_t(options_.n_min)));
}

void NgramDrafter::append(int32_t token) {
  tokens_.push_back(token);
  const size_t end = tokens_.size() - 1;
  if (tokens_.size() < size_t(options_.n_min)) {
    previous_.push_back(-1);
    return;
  }
  auto [it, fresh] = head_.try_emplace(key_ending_at(end), int32_t(end));
  previous_.push_back(fresh ? -1 : it->second);
  it->second = int32_t(end);
}

void NgramDrafter::append(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) append(t);
}

void NgramDrafter::truncate(size_t length) {
  while (tokens_.size() > length) {
    const size_t end = tokens_.size() - 1;
    if (tokens_.size() >= size_t(options_.n_min)) {
      auto it = head_.find(key_ending_at(end));
      // Appends are undone in reverse, so this position is its n-gram's most recent.
      assert(it != head_.end() && it->second == int32_t(end));
      if (previous_[end] < 0)
        head_.erase(it);
      else
        it->second = previous_[end];
    }
    tokens_.pop_back();
    previous_.pop_back();
  }
}

NgramDrafter::Draft NgramDrafter::draft(size_t max_tokens) const {
  Draft best;
  const size_t n = tokens_.size();
  if (max_tokens == 0 || n < size_t(options_.n_min) + 1) return best;
  const size_t last = n - 1;
  // The suffix's own entry is the head; its earlier occurrences follow on the chain.
  int32_t candidate = previous_[last];
  int32_t best_end = -1;
  for (int32_t tried = 0; candidate >= 0 && tried < options_.max_candidates;
       ++tried, candidate = previous_[size_t(candidate)]) {
    const int32_t length =
        matching_tail(std::span(tokens_).first(size_t(candidate) + 1), tokens_, options_.n_max);
    // Most recent first: a later candidate must be strictly longer to win.
    if (length >= options_.n_min && length > best.match) {
      best.match = length;
      best_end = candidate;
      if (length == options_.n_max) break;
    }
  }
  if (best_end < 0) return best;
  const size_t from = size_t(best_end) + 1, to = from + std::min(max_tokens, n - from);
  best.tokens.assign(tokens_.begin() + long(from), tokens_.begin() + long(to));
  return best;
}

} // namespace offgraph::engine
