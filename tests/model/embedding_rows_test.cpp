// Batch::embeddings (image rows in place of token rows): a row given as the token's own
// embedding computes exactly what the token does, whatever id names it; other rows change the
// logits from there on; a batch mixing a span with embedding rows and one without equals each
// alone; malformed embedding batches are refused by name. Both architectures, f32 weights.
#include "kv/kv_store.h"
#include "model/forward.h"
#include "model/model.h"
#include "model_test_util.h"
#include "synth/synth.h"

#include <gtest/gtest.h>

#include <random>

namespace offgraph::model {
namespace {

using testing::rel_error;
using testing::temp_dir;

struct Session {
  std::unique_ptr<Model> model;
  std::unique_ptr<kv::KvStore> store;
  std::unique_ptr<Forward> fwd;
  explicit Session(const std::string &arch) {
    synth::SynthSpec s = synth::preset("tiny", arch).value();
    s.n_layer = 4, s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 96;
    s.window = 8, s.n_vocab = 300, s.seed = 21, s.weight_type = GGML_TYPE_F32;
    const std::string path = (temp_dir() / ("embd-" + arch + ".gguf")).string();
    auto w = synth::write_model(s, path);
    EXPECT_TRUE(w.ok()) << w.message();
    auto m = Model::load(path);
    EXPECT_TRUE(m.ok()) << m.message();
    model = std::move(m).value();
    auto layout = make_layout(*model, {128, 16, 4});
    auto st = kv::KvStore::create(*layout, {GGML_TYPE_F32, GGML_TYPE_F32},
                                  ggml_backend_cpu_buffer_type());
    EXPECT_TRUE(st.ok()) << st.message();
    store = std::move(st).value();
    fwd = std::make_unique<Forward>(*model, *store, 2);
  }
  // The token's row of the (f32) embedding table.
  std::vector<float> row_of(int32_t token) const {
    const ggml_tensor *t = model->weights().tok_embd;
    const float *d = static_cast<const float *>(t->data) + size_t(token) * size_t(t->ne[0]);
    return {d, d + t->ne[0]};
  }
};

// Every row's logits of `b` on a fresh sequence per span.
Result<std::vector<float>> run(Session &s, Batch b) {
  for (Batch::Span &sp : b.spans) sp.seq = *s.store->create_sequence();
  b.logit_rows.clear();
  for (size_t i = 0; i < b.tokens.size(); ++i) b.logit_rows.push_back(int32_t(i));
  return s.fwd->run(b);
}

Batch one_span(const std::vector<int32_t> &tokens) {
  Batch b;
  b.tokens = tokens;
  b.spans.push_back({0, 0, int32_t(tokens.size())});
  return b;
}

class EmbeddingRows : public ::testing::TestWithParam<const char *> {};

TEST_P(EmbeddingRows, TakeTheTokensPlaceExactly) {
  Session s(GetParam());
  const int32_t V = 300, E = 64;
  std::vector<int32_t> tokens = {5, 17, 99, 4, 250, 31, 7, 180, 66, 12};
  auto plain = run(s, one_span(tokens));
  ASSERT_TRUE(plain.ok()) << plain.message();
  // Rows 2..5 as embeddings equal to their tokens' rows, named by ids outside the vocabulary.
  Batch b = one_span(tokens);
  for (int32_t i = 2; i <= 5; ++i) {
    b.embedding_at.push_back(i);
    const auto r = s.row_of(tokens[size_t(i)]);
    b.embeddings.insert(b.embeddings.end(), r.begin(), r.end());
    b.tokens[size_t(i)] = 1000000 + i;
  }
  auto same = run(s, b);
  ASSERT_TRUE(same.ok()) << same.message();
  ASSERT_EQ(same->size(), plain->size());
  double worst = 0;
  for (size_t r = 0; r < tokens.size(); ++r)
    worst = std::max(worst, rel_error(same->data() + r * V, plain->data() + r * V, size_t(V)));
  EXPECT_LE(worst, 1e-6);
  // Other rows: the rows before them are untouched (causal), every row from them on changes.
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float &x : b.embeddings) x = normal(rng);
  auto other = run(s, b);
  ASSERT_TRUE(other.ok()) << other.message();
  for (size_t r = 0; r < tokens.size(); ++r) {
    const double e = rel_error(other->data() + r * V, plain->data() + r * V, size_t(V));
    if (r < 2) {
      EXPECT_LE(e, 1e-6) << "row " << r;
    } else {
      EXPECT_GT(e, 1e-3) << "row " << r;
    }
  }
  // Two spans in one batch, one with embedding rows: each as alone.
  Batch both;
  both.tokens = b.tokens;
  both.tokens.insert(both.tokens.end(), tokens.begin(), tokens.end());
  both.spans = {{0, 0, 10}, {0, 0, 10}};
  both.embedding_at = b.embedding_at;
  both.embeddings = b.embeddings;
  auto mixed = run(s, both);
  ASSERT_TRUE(mixed.ok()) << mixed.message();
  for (size_t r = 0; r < 10; ++r) {
    EXPECT_LE(rel_error(mixed->data() + r * V, other->data() + r * V, size_t(V)), 1e-5);
    EXPECT_LE(rel_error(mixed->data() + (10 + r) * V, plain->data() + r * V, size_t(V)), 1e-5);
  }
  // Malformed: not ascending, the wrong number of values, an id outside the vocabulary on a
  // token row.
  Batch bad = b;
  std::swap(bad.embedding_at[0], bad.embedding_at[1]);
  auto r1 = run(s, bad);
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.message().find("ascending"), std::string::npos) << r1.message();
  bad = b;
  bad.embeddings.resize(size_t(E) * 3);
  auto r2 = run(s, bad);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.message().find("embedding values"), std::string::npos) << r2.message();
  bad = b;
  bad.tokens[0] = V + 5;
  auto r3 = run(s, bad);
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.message().find("outside the vocabulary"), std::string::npos) << r3.message();
  std::printf("[ embd     ] %s: token rows given as embeddings: worst %.2g from the tokens\n",
              GetParam(), worst);
}

INSTANTIATE_TEST_SUITE_P(Architectures, EmbeddingRows, ::testing::Values("muse-glimmer", "llama"),
                         [](const auto &param_info) {
                           return std::string(param_info.param) == "llama" ? "Llama"
                                                                           : "MuseGlimmer";
                         });

} // namespace
} // namespace offgraph::model
