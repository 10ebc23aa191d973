// The same script on two sessions of one model, one on the CPU alone and one with its layers on
// other devices (ggml-rpc servers: rpc_test.cpp; local GPUs: gpu_test.cpp): every row's logits
// within a relative bound and the same greedy tokens, with the rings wrapping, across forks,
// rewinds and snapshots.
#pragma once

#include "model/forward.h"
#include "model_test_util.h"
#include "synth/synth.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>

namespace offgraph::model::testing {

inline std::string make_model(const std::string &arch, uint64_t seed) {
  synth::SynthSpec s = synth::preset("tiny", arch).value();
  s.n_layer = 6, s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 96;
  s.window = 12, s.n_vocab = 300, s.seed = seed, s.weight_type = GGML_TYPE_F32;
  const std::string path = (temp_dir() / (arch + std::to_string(seed) + ".gguf")).string();
  auto r = synth::write_model(s, path);
  EXPECT_TRUE(r.ok()) << r.message();
  return path;
}

struct Session {
  std::unique_ptr<Model> model;
  std::unique_ptr<kv::KvStore> store;
  std::unique_ptr<Forward> fwd;
  // `kv_type`: both K and V storage (f32 by default; a GPU's flash attention takes f16).
  Session(const std::string &path, std::shared_ptr<const Devices> devices,
          ggml_type kv_type = GGML_TYPE_F32) {
    auto m = Model::load(path, nullptr, std::move(devices));
    EXPECT_TRUE(m.ok()) << m.message();
    if (!m.ok()) return;
    model = std::move(m).value();
    auto layout = make_layout(*model, {256, 8, 4});
    EXPECT_TRUE(layout.ok()) << layout.message();
    auto s = kv::KvStore::create(*layout, {kv_type, kv_type}, model->cache_buffer_types(), 64);
    EXPECT_TRUE(s.ok()) << s.message();
    store = std::move(s).value();
    fwd = std::make_unique<Forward>(*model, *store, 2);
  }
  // Every row's logits of a span of `tokens` continuing `seq`.
  std::vector<float> step(kv::SeqId seq, const std::vector<int32_t> &tokens) {
    Batch b;
    b.tokens = tokens;
    b.spans.push_back({seq, store->sequence(seq)->length(), int32_t(tokens.size())});
    for (size_t i = 0; i < tokens.size(); ++i) b.logit_rows.push_back(int32_t(i));
    auto l = fwd->run(b);
    EXPECT_TRUE(l.ok()) << l.message();
    return l.ok() ? *l : std::vector<float>{};
  }
  // A span of `tokens` continuing `seq` that wants no logits (a prompt chunk before the last):
  // the pass computes only the cache's writes.
  void fill(kv::SeqId seq, const std::vector<int32_t> &tokens) {
    Batch b;
    b.tokens = tokens;
    b.spans.push_back({seq, store->sequence(seq)->length(), int32_t(tokens.size())});
    auto l = fwd->run(b);
    ASSERT_TRUE(l.ok()) << l.message();
    EXPECT_TRUE(l->empty());
  }
};

inline int32_t argmax(const float *row, int32_t n) {
  return int32_t(std::max_element(row, row + n) - row);
}

// Runs the same script on both sessions and compares every row: a prompt in chunks, greedy decode
// past several windows, a fork decoded on its own, a rewind, a snapshot restored.
// `decode_graphs_reused`: how many of the 40 decode steps computed the last step's graph again.
// `tag` names the device kind in the summary line; `bound` is the relative error allowed per row.
// `one_token_steps`: every span is computed one token at a time on both sessions (a GPU's f32
// matrix products of 2-16 rows use TF32 tensor cores, ggml-cuda's choice; single rows are f32).
inline void compare(Session &cpu, Session &split, uint64_t seed, int64_t &decode_graphs_reused,
                    const char *tag = "rpc", double bound = 1e-4, bool one_token_steps = false) {
  ASSERT_TRUE(cpu.model && split.model);
  const int32_t V = cpu.model->config().n_vocab;
  std::mt19937_64 rng(seed);
  double worst = 0;
  int rows = 0;
  auto same = [&](const std::vector<float> &a, const std::vector<float> &b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t r = 0; r * size_t(V) < a.size(); ++r) {
      const double e = rel_error(b.data() + r * size_t(V), a.data() + r * size_t(V), size_t(V));
      worst = std::max(worst, e), ++rows;
      ASSERT_LE(e, bound) << "row " << r;
      ASSERT_EQ(argmax(a.data() + r * size_t(V), V), argmax(b.data() + r * size_t(V), V));
    }
  };
  auto run = [&](Session &s, kv::SeqId seq, const std::vector<int32_t> &t) {
    if (!one_token_steps) return s.step(seq, t);
    std::vector<float> all;
    for (int32_t token : t) {
      const auto row = s.step(seq, {token});
      all.insert(all.end(), row.begin(), row.end());
    }
    return all;
  };
  auto both = [&](kv::SeqId sc, kv::SeqId ss, const std::vector<int32_t> &t) {
    const auto a = run(cpu, sc, t), b = run(split, ss, t);
    same(a, b);
    return a;
  };
  const kv::SeqId c0 = *cpu.store->create_sequence(), s0 = *split.store->create_sequence();
  std::vector<int32_t> prompt(30);
  for (int32_t &t : prompt) t = std::uniform_int_distribution<int32_t>(0, V - 1)(rng);
  for (size_t at = 0; at < prompt.size(); at += 7) {
    const std::vector<int32_t> chunk(prompt.begin() + long(at),
                                     prompt.begin() + long(std::min(at + 7, prompt.size())));
    if (at == 7 && !one_token_steps) { // one chunk that wants no logits, on both
      cpu.fill(c0, chunk), split.fill(s0, chunk);
      continue;
    }
    both(c0, s0, chunk);
  }
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  // A snapshot at the prompt's end (the rings will have wrapped past it).
  auto snap_c = cpu.store->snapshot(c0), snap_s = split.store->snapshot(s0);
  ASSERT_TRUE(snap_c.ok() && snap_s.ok());
  both(c0, s0, {42, 43}); // two tokens, rewound: the rings take them back
  ASSERT_TRUE(cpu.store->rewind(c0, 30).ok());
  ASSERT_TRUE(split.store->rewind(s0, 30).ok());
  int32_t next = prompt.back();
  const int64_t reused_before = split.fwd->graphs_reused();
  for (int i = 0; i < 40; ++i) { // greedy, past three windows of 12
    auto l = both(c0, s0, {next});
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    next = argmax(l.data(), V);
  }
  decode_graphs_reused = split.fwd->graphs_reused() - reused_before;
  // A fork of everything so far (pages shared, rings copied on the devices), decoded on its own.
  const int32_t n = cpu.store->sequence(c0)->length();
  auto fc = cpu.store->fork(c0, n), fs_ = split.store->fork(s0, n);
  ASSERT_TRUE(fc.ok() && fs_.ok()) << fc.message() << fs_.message();
  both(*fc, *fs_, {5, 9, 11});
  // Back to the snapshot: the rings return to the prompt's end.
  ASSERT_TRUE(cpu.store->restore(c0, **snap_c).ok());
  ASSERT_TRUE(split.store->restore(s0, **snap_s).ok());
  both(c0, s0, {prompt.back(), 17, 23});
  std::printf("[ %-8s ] %s: %d rows, worst relative error %.2g (bound %.0e); %lld of 40 "
              "decode steps reused the last graph (%lld graphs built, %lld reused in all)\n",
              tag, cpu.model->config().arch_name.c_str(), rows, worst, bound,
              (long long)decode_graphs_reused, (long long)split.fwd->graphs_built(),
              (long long)split.fwd->graphs_reused());
}

} // namespace offgraph::model::testing
