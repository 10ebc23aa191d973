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

// The compute limit on `s` (a fresh session; `ref` another of the same model, no limit): a
// prefill chunk measured (model::Forward::measure, which computes and commits nothing and
// allocates no buffer) and run one byte short of its largest buffer is refused before anything is
// computed, the message naming the budget, the sequence and the buffers as they were; at its
// measure it runs, and the buffers it leaves are the measure; under a limit below what it left,
// steps that fit those buffers run (a limit bounds growth), with the logits of `ref`.
inline void check_compute_limit(Session &s, Session &ref) {
  std::mt19937_64 rng(41);
  std::vector<int32_t> tokens(16);
  for (int32_t &t : tokens) t = std::uniform_int_distribution<int32_t>(0, 299)(rng);
  const kv::SeqId a = *s.store->create_sequence(), r = *ref.store->create_sequence();
  Batch chunk;
  chunk.tokens.assign(tokens.begin(), tokens.begin() + 8);
  chunk.spans.push_back({a, 0, 8});
  for (int32_t i = 0; i < 8; ++i) chunk.logit_rows.push_back(i);
  auto need = s.fwd->measure(chunk);
  ASSERT_TRUE(need.ok()) << need.message();
  EXPECT_EQ(s.store->sequence(a)->length(), 0);
  // The span's storage is reserved as for a run (the sequence keeps it for those rows): what
  // the chunk then takes, and no more (checked once it ran, below).
  const int64_t stored = s.store->bytes_in_use();
  EXPECT_TRUE(s.fwd->compute_buffer_bytes().empty() || [&] {
    for (const auto &[buft, bytes] : s.fwd->compute_buffer_bytes())
      if (bytes) return false;
    return true;
  }()) << "measuring allocated a buffer";
  ggml_backend_buffer_type_t most = nullptr;
  int64_t most_bytes = 0;
  for (const auto &[buft, bytes] : *need)
    if (bytes > most_bytes) most = buft, most_bytes = bytes;
  ASSERT_GT(most_bytes, 0);
  int64_t limit = most_bytes - 1;
  s.fwd->set_compute_limit(
      [&](ggml_backend_buffer_type_t buft) -> int64_t { return buft == most ? limit : -1; });
  auto refused = s.fwd->run(chunk);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(s.fwd->allocation_failed());
  EXPECT_NE(refused.message().find("compute budget"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find(ggml_backend_buft_name(most)), std::string::npos);
  EXPECT_EQ(s.fwd->compute_refusals(), 1);
  EXPECT_EQ(s.store->sequence(a)->length(), 0);
  EXPECT_EQ(s.store->bytes_in_use(), stored);
  for (const auto &[buft, bytes] : s.fwd->compute_buffer_bytes()) // none grew, or was freed
    EXPECT_EQ(bytes, 0) << ggml_backend_buft_name(buft);

  limit = most_bytes;
  std::vector<float> got = s.step(a, chunk.tokens);
  EXPECT_EQ(s.store->bytes_in_use(), stored);
  std::vector<float> want = ref.step(r, chunk.tokens);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LE(rel_error(got.data(), want.data(), got.size()), 1e-5);
  for (const auto &[buft, bytes] : *need) {
    int64_t held = 0;
    for (const auto &[b, h] : s.fwd->compute_buffer_bytes())
      if (b == buft) held = h;
    EXPECT_EQ(held, bytes) << ggml_backend_buft_name(buft);
  }
  limit = most_bytes / 2;
  for (size_t i = 8; i < tokens.size(); ++i) { // one token a step: within the buffers
    got = s.step(a, {tokens[i]});
    want = ref.step(r, {tokens[i]});
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LE(rel_error(got.data(), want.data(), got.size()), 1e-5) << "position " << i;
  }
  EXPECT_EQ(s.fwd->compute_refusals(), 1);
  std::printf("[ model    ] compute limit: a chunk of 8 needs %lld bytes on %s; refused one byte "
              "short, ran at its measure\n",
              (long long)most_bytes, ggml_backend_buft_name(most));
}

} // namespace offgraph::model::testing
