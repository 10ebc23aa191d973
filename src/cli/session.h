// Session: one conversation's sequence over a model, for `offgraph run` and `offgraph chat`. It
// mirrors the tokens the cache holds, so that a new prompt reuses the longest common prefix:
// rewinding where the rings allow, restoring the snapshot taken at an earlier prompt's end where
// they do not, and computing only the rest. (The engine of the server will do the same for many
// sequences; this is the single-sequence form.)
#pragma once

#include "base/status.h"
#include "kv/kv_store.h"
#include "model/forward.h"

#include <chrono>
#include <memory>
#include <vector>

namespace offgraph::cli {

struct SessionOptions {
  int32_t ctx = 4096;
  int32_t max_write = 256;
  int threads = 2;
  kv::StorageTypes types;
  size_t max_snapshots = 8;
};

struct SessionStats {
  int64_t prompt_tokens = 0, reused_tokens = 0, generated_tokens = 0;
  double prompt_seconds = 0, generate_seconds = 0;
};

class Session {
public:
  static Result<std::unique_ptr<Session>> create(const model::Model &model, SessionOptions options);

  const std::vector<int32_t> &tokens() const { return tokens_; }
  int32_t capacity() const { return options_.ctx; }

  // Makes the cache hold exactly `prompt` and returns the logits after its last token. Reuses the
  // longest common prefix with what the cache holds (always recomputing at least the last token),
  // then takes a snapshot at the prompt's end, so a later prompt that rewrites what follows can
  // come back here exactly even after the rings wrapped.
  Result<std::vector<float>> prompt(const std::vector<int32_t> &prompt);
  // Appends one generated token; returns the logits after it.
  Result<std::vector<float>> step(int32_t token);
  // Forgets everything.
  void reset();

  const SessionStats &stats() const { return stats_; }

private:
  Session(const model::Model &model, SessionOptions options) : model_(model), options_(options) {}
  Result<std::vector<float>> compute(const std::vector<int32_t> &tokens, size_t from);
  // Brings the cache back to `length` (<= what it holds): rewind, else a snapshot at or before it.
  int32_t rewind_to(int32_t length);

  const model::Model &model_;
  SessionOptions options_;
  std::unique_ptr<kv::KvStore> store_;
  std::unique_ptr<model::Forward> forward_;
  kv::SeqId seq_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<std::unique_ptr<kv::Snapshot>> snapshots_; // oldest first
  SessionStats stats_;
};

} // namespace offgraph::cli
