// The trained default model (models/muse-glimmer-kjv.gguf, made by tools/train): it loads with its
// own vocabulary and chat template, a ring cache gives the logits of a full cache (a ring loses
// nothing inside the window), and greedy decoding writes English. Its perplexity band is checked
// through the program by trained_model_ppl.cmake.
#include "kv/kv_store.h"
#include "model/forward.h"
#include "text/tokenizer/tokenizer.h"

#include "ggml-cpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace offgraph::model {
namespace {

const char *kModel = OFFGRAPH_TRAINED_MODEL;
const char *kText = OFFGRAPH_HELDOUT_TEXT;

std::string read_text() {
  std::ifstream in(kText, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TrainedModel, LoadsWithItsVocabularyAndTemplate) {
  auto m = Model::load(kModel);
  ASSERT_TRUE(m.ok()) << m.message();
  const ModelConfig &c = (*m)->config();
  EXPECT_EQ(c.arch_name, "muse-glimmer");
  EXPECT_EQ(c.window, 64);
  ASSERT_EQ(c.n_layer % 4, 0);
  for (int32_t i = 0; i < c.n_layer; ++i) EXPECT_EQ(c.sliding(i), i % 4 != 3) << i;
  EXPECT_FLOAT_EQ(c.softcap, 20.0f);

  auto tok = text::Tokenizer::from_gguf(kModel);
  ASSERT_TRUE(tok.ok()) << tok.message();
  const text::Tokenizer &t = **tok;
  EXPECT_EQ(t.n_vocab(), c.n_vocab);
  EXPECT_EQ(t.pre_tokenizer_name(), "llama4");
  EXPECT_TRUE(t.add_bos_default());
  EXPECT_EQ(t.token_piece(t.bos()), "<|begin_of_text|>");
  EXPECT_EQ(t.token_piece(t.eos()), "<|end_of_text|>");
  EXPECT_EQ(t.token_piece(t.eot()), "<|eot|>");
  for (const char *s : {"<|start|>", "<|message|>", "<|eot|>", "<|eom|>", "<|end_of_text|>"}) {
    auto id = t.find_token(s);
    ASSERT_TRUE(id.has_value()) << s;
    EXPECT_TRUE(t.is_control(*id)) << s;
  }
  // A chat turn tokenizes into its control tokens and words.
  const auto ids = t.encode("<|start|>user<|message|>Hello<|eot|>", false, true);
  ASSERT_GE(ids.size(), 5u);
  EXPECT_EQ(ids.front(), *t.find_token("<|start|>"));
  EXPECT_EQ(ids.back(), t.eot());
  auto tmpl = (*m)->file().str("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  EXPECT_NE(tmpl->find("<atem:function_calls>"), std::string::npos);
}

// Every row's logits for `tokens`, fed `chunk` at a time into a cache made with `policy`.
std::vector<float> all_logits(const Model &m, const std::vector<int32_t> &tokens,
                              cache::Policy policy, int32_t chunk, kv::StorageTypes types,
                              kv::RingOrder order, int *n_ring) {
  auto layout = make_layout(m, policy);
  EXPECT_TRUE(layout.ok()) << layout.message();
  *n_ring = 0;
  for (int32_t i = 0; i < (*layout)->n_caches(); ++i) *n_ring += (*layout)->cache(i).ring();
  auto store = kv::KvStore::create(*layout, types, ggml_backend_cpu_buffer_type());
  EXPECT_TRUE(store.ok()) << store.message();
  EXPECT_TRUE((*store)->set_ring_order(order).ok());
  const kv::SeqId seq = *(*store)->create_sequence();
  Forward fwd(m, **store, 2);
  std::vector<float> out;
  for (size_t at = 0; at < tokens.size(); at += size_t(chunk)) {
    const int32_t n = int32_t(std::min(tokens.size() - at, size_t(chunk)));
    Batch b;
    b.tokens.assign(tokens.begin() + long(at), tokens.begin() + long(at) + n);
    b.spans.push_back({seq, int32_t(at), n});
    for (int32_t i = 0; i < n; ++i) b.logit_rows.push_back(i);
    auto l = fwd.run(b);
    EXPECT_TRUE(l.ok()) << l.message();
    if (!l.ok()) return {};
    out.insert(out.end(), l->begin(), l->end());
  }
  return out;
}

TEST(TrainedModel, RingCacheGivesTheLogitsOfAFullCache) {
  auto m = Model::load(kModel);
  ASSERT_TRUE(m.ok()) << m.message();
  auto tok = text::Tokenizer::from_gguf(kModel);
  ASSERT_TRUE(tok.ok());
  std::vector<int32_t> tokens = (*tok)->encode(read_text(), true, false);
  ASSERT_GE(tokens.size(), 256u);
  tokens.resize(192); // three windows: the rings (64 + reach slots) wrap twice
  const int32_t chunk = 32;
  // Reach 31: rings of 95 slots, every chunk written before it is attended. Reach 0: rings of the
  // window alone, every chunk attended (older rows, then its own) before it is written.
  for (const int32_t reach : {31, 0})
    for (ggml_type type : {GGML_TYPE_F32, GGML_TYPE_F16}) {
      for (kv::RingOrder order : {kv::RingOrder::Physical, kv::RingOrder::Logical}) {
        int rings = 0, none = 0;
        const kv::StorageTypes types{type, type};
        const auto ring =
            all_logits(**m, tokens, {192, chunk, 192, reach}, chunk, types, order, &rings);
        const auto full = all_logits(**m, tokens, {192, 192, 192, 192}, chunk, types, order, &none);
        EXPECT_EQ(rings, 3);
        EXPECT_EQ(none, 0);
        ASSERT_EQ(ring.size(), full.size());
        double worst = 0;
        for (size_t i = 0; i < ring.size(); ++i)
          worst = std::max(worst, std::fabs(double(ring[i]) - double(full[i])));
        // Logical order reads the window's rows in the order a full cache holds them: the same
        // sums, bit for bit. Physical order sums them in slot order once a ring wraps; the last-bit
        // differences then flip a few roundings where ggml converts activations to f16 for the f16
        // weights, which moves logits by up to ~2e-2 (docs/quality.md).
        const double tolerance = order == kv::RingOrder::Logical ? 0.0 : 5e-2;
        EXPECT_LE(worst, tolerance) << (order == kv::RingOrder::Logical ? "logical " : "physical ")
                                    << kv::storage_type_name(type);
        std::printf("%s ring (reach %d), %s storage: largest logit difference from a full cache "
                    "%.3g\n",
                    order == kv::RingOrder::Logical ? "logical" : "physical", reach,
                    kv::storage_type_name(type).c_str(), worst);
      }
    }
}

TEST(TrainedModel, GreedyDecodingWritesEnglish) {
  auto m = Model::load(kModel);
  ASSERT_TRUE(m.ok()) << m.message();
  auto tok = text::Tokenizer::from_gguf(kModel);
  ASSERT_TRUE(tok.ok());
  std::vector<int32_t> ids = (*tok)->encode("And God said unto", true, false);
  const size_t prompt = ids.size();
  auto layout = make_layout(**m, {256, 64, 256});
  ASSERT_TRUE(layout.ok());
  auto store =
      kv::KvStore::create(*layout, {GGML_TYPE_F16, GGML_TYPE_F16}, ggml_backend_cpu_buffer_type());
  ASSERT_TRUE(store.ok());
  const kv::SeqId seq = *(*store)->create_sequence();
  Forward fwd(**m, **store, 2);
  int32_t fed = 0;
  const int32_t n_vocab = (*m)->config().n_vocab;
  for (int step = 0; step < 24; ++step) {
    Batch b;
    b.tokens.assign(ids.begin() + fed, ids.end());
    b.spans.push_back({seq, fed, int32_t(b.tokens.size())});
    b.logit_rows = {int32_t(b.tokens.size()) - 1};
    fed = int32_t(ids.size());
    auto l = fwd.run(b);
    ASSERT_TRUE(l.ok()) << l.message();
    ids.push_back(int32_t(std::max_element(l->begin(), l->begin() + n_vocab) - l->begin()));
  }
  const std::string out =
      (*tok)->decode(std::vector<int32_t>(ids.begin() + long(prompt), ids.end()));
  int known = 0;
  for (const char *w : {" the ", " and ", " of ", " unto ", " Moses", " LORD", " him", " them"})
    known += out.find(w) != std::string::npos;
  EXPECT_GE(known, 2) << out;
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](char ch) {
    return (ch >= 32 && ch < 127) || ch == '\n';
  })) << out;
}

} // namespace
} // namespace offgraph::model
