// The model layer against full recomputation: decoding step by step and in prefill chunks of
// varied size gives, at every position, the logits of recomputing the whole prefix from an empty
// cache (where the sliding layers are not even rings). And malformed files get clear errors.
#include "device_compare.h"
#include "model/amx_matmul.h"
#include "model/arch.h"
#include "model/cpu_matmul.h"
#include "model/forward.h"
#include "model/weight_memory.h"
#include "model_test_util.h"
#include "synth/synth.h"

#include "ggml-cpu.h"
#include "gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

namespace offgraph::model {
namespace {

namespace fs = std::filesystem;
using testing::rel_error;
using testing::temp_dir;

std::string make_model(const synth::SynthSpec &spec, const std::string &name) {
  const std::string path = (temp_dir() / name).string();
  auto r = synth::write_model(spec, path);
  EXPECT_TRUE(r.ok()) << r.message();
  return path;
}

synth::SynthSpec small_spec(const std::string &arch, bool array_pattern, uint64_t seed) {
  synth::SynthSpec s = synth::preset("tiny", arch).value();
  s.n_layer = 5, s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 96;
  s.window = 12;
  s.pattern_array = array_pattern;
  s.n_vocab = 300;
  s.seed = seed;
  return s;
}

struct Session {
  std::unique_ptr<Model> model;
  std::unique_ptr<kv::KvStore> store;
  std::unique_ptr<Forward> fwd;
  Session(const std::string &path, int32_t capacity, int32_t max_write,
          int32_t ring_reach = cache::Policy{}.ring_reach) {
    auto m = Model::load(path);
    EXPECT_TRUE(m.ok()) << m.message();
    model = std::move(m).value();
    auto layout = make_layout(*model, {capacity, max_write, 4, ring_reach});
    EXPECT_TRUE(layout.ok()) << layout.message();
    auto s = kv::KvStore::create(*layout, {GGML_TYPE_F32, GGML_TYPE_F32},
                                 ggml_backend_cpu_buffer_type());
    EXPECT_TRUE(s.ok()) << s.message();
    store = std::move(s).value();
    fwd = std::make_unique<Forward>(*model, *store, 2);
  }
};

// Logits of every position of `tokens`, in chunks drawn from `chunks`.
std::vector<float> incremental(Session &s, kv::SeqId seq, const std::vector<int32_t> &tokens,
                               std::mt19937_64 &rng, int32_t max_chunk) {
  std::vector<float> all;
  for (size_t at = 0; at < tokens.size();) {
    const int32_t n = std::min<int32_t>(std::uniform_int_distribution<int32_t>(1, max_chunk)(rng),
                                        int32_t(tokens.size() - at));
    Batch b;
    b.tokens.assign(tokens.begin() + long(at), tokens.begin() + long(at) + n);
    b.spans.push_back({seq, int32_t(at), n});
    for (int32_t i = 0; i < n; ++i) b.logit_rows.push_back(i);
    auto l = s.fwd->run(b);
    EXPECT_TRUE(l.ok()) << l.message();
    if (!l.ok()) return {};
    all.insert(all.end(), l->begin(), l->end());
    at += size_t(n);
  }
  return all;
}

// Decodes N random tokens in random chunks of up to max_chunk and compares every position's logits
// with recomputing the whole prefix in one step (where sliding caches are stored flat).
void check_against_recompute(const std::string &path, uint64_t seed, int32_t N, int32_t max_chunk,
                             kv::RingOrder order = kv::RingOrder::Physical,
                             kv::AttentionKernel kernel = kv::AttentionKernel::Grouped,
                             double tolerance = 1e-4) {
  std::mt19937_64 rng(seed);
  // Rings of the window and 2 more slots: chunks of up to 3 tokens write before they attend, longer
  // ones attend (older rows, then their own) before they write, after every layer reading the
  // cache. The reference's rings would be at least the capacity: flat.
  Session inc(path, N, max_chunk, 2);
  ASSERT_TRUE(inc.store->set_ring_order(order).ok());
  inc.store->set_attention_kernel(kernel);
  Session ref(path, N, N, N);
  ref.store->set_attention_kernel(kernel);
  const int32_t V = inc.model->config().n_vocab;
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  for (int32_t &t : tokens) t = std::uniform_int_distribution<int32_t>(0, V - 1)(rng);
  const bool sliding = inc.model->config().n_sliding() > 0;
  ASSERT_EQ(inc.store->layout().has_ring(), sliding);
  ASSERT_FALSE(ref.store->layout().has_ring());

  const kv::SeqId a = *inc.store->create_sequence();
  std::vector<float> got = incremental(inc, a, tokens, rng, max_chunk);
  ASSERT_EQ(got.size(), size_t(N) * size_t(V));
  const kv::SeqId r = *ref.store->create_sequence();
  double worst = 0;
  for (int32_t p = 0; p < N; ++p) {
    ref.store->sequence(r)->clear();
    Batch b;
    b.tokens.assign(tokens.begin(), tokens.begin() + p + 1);
    b.spans.push_back({r, 0, p + 1});
    b.logit_rows = {p};
    auto want = ref.fwd->run(b);
    ASSERT_TRUE(want.ok()) << want.message();
    const double err = rel_error(got.data() + size_t(p) * size_t(V), want->data(), size_t(V));
    worst = std::max(worst, err);
    ASSERT_LE(err, tolerance) << "position " << p;
  }
  std::printf("[ model    ] %s, weights %s: %d positions, worst relative error %.2g (bound %.2g)\n",
              inc.model->config().arch_name.c_str(),
              ggml_type_name(inc.model->weights().layers[0].wq.w->type), N, worst, tolerance);
}

// Each architecture's row carries the sampling its authors recommend (engine::default_sampling
// puts it into a request that sets none).
TEST(Architectures, RecommendedSampling) {
  const Architecture *muse = find_architecture("muse-glimmer");
  ASSERT_NE(muse, nullptr);
  ASSERT_NE(muse->sampling, nullptr);
  EXPECT_EQ(muse->sampling->temperature, 1.0f); // MUSE_GLIMMER.md 11
  EXPECT_EQ(muse->sampling->top_p, 0.95f);
  EXPECT_EQ(muse->sampling->top_k, 64);
  EXPECT_EQ(muse->sampling->min_p, 0.0f);
  const Architecture *llama = find_architecture("llama");
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama->sampling, nullptr); // the generic defaults
}

// 50 positions: more than three windows of 12.
TEST(ModelRecompute, MuseGlimmerScalarPattern) {
  check_against_recompute(make_model(small_spec("muse-glimmer", false, 1), "mg-scalar.gguf"), 11,
                          50, 7);
}
TEST(ModelRecompute, MuseGlimmerArrayPattern) {
  check_against_recompute(make_model(small_spec("muse-glimmer", true, 2), "mg-array.gguf"), 12, 50,
                          7);
}
TEST(ModelRecompute, Llama) {
  check_against_recompute(make_model(small_spec("llama", false, 3), "llama.gguf"), 13, 40, 5);
}

// Gemma 4's shapes (synth presets at test widths, window 16, a 300-token vocabulary): E2B with
// per-layer embeddings, double-wide FFNs and 5 of 10 layers reading donors 3 (sliding) and 4
// (global); E4B with 6 of 12 shared; 31B with fewer KV heads on its global layers, whose V is K.
// The recompute stores every cache flat in one step; the incremental run writes rings in chunks
// that wrap, and its shared layers read their donors' rings as they stand. (Which layer donates is
// checked against libllama in peer.gemma4 and against both rules in cache_property_tests.)
synth::SynthSpec gemma4_spec(const std::string &preset, uint64_t seed) {
  synth::SynthSpec s = synth::preset(preset, "gemma4").value();
  s.n_vocab = 300;
  s.seed = seed;
  return s;
}
// Bound 1e-3: attention scale 1 over RMS-normed Q and K makes sharper softmaxes than Muse
// Glimmer's, and chunked decode (grouped and tiled kernels) sums in another order than the
// one-step recompute; measured 1e-7 to 3.4e-4, no larger after the rings wrap (at 16) than
// before.
constexpr double kGemma4Bound = 1e-3;
// synth plans its tensors with a planning binder (tools/synth): every preset's file loads with
// the real binder (shapes, types, nothing left over), and holds the planned tensors in order.
TEST(ModelFiles, EverySynthPresetLoadsAndHoldsThePlannedTensorsInOrder) {
  struct Case {
    const char *arch, *preset;
  };
  for (const Case &c :
       {Case{"muse-glimmer", "tiny"}, Case{"muse-glimmer", "small"}, Case{"llama", "tiny"},
        Case{"gemma4", "e2b"}, Case{"gemma4", "e4b"}, Case{"gemma4", "31b"}}) {
    SCOPED_TRACE(std::string(c.arch) + " " + c.preset);
    synth::SynthSpec s = synth::preset(c.preset, c.arch).value();
    s.n_vocab = 300;
    const std::string path =
        make_model(s, std::string("preset-") + c.arch + "-" + c.preset + ".gguf");
    auto m = Model::open_metadata(path);
    ASSERT_TRUE(m.ok()) << m.message();
    // The file's tensor order against the binding order of its own architecture.
    const Architecture *arch = find_architecture((*m)->config().arch_name);
    ASSERT_NE(arch, nullptr);
    TensorBinder planner(
        [&](const std::string &name) { return (*m)->file().tensor(name) != nullptr; });
    Weights w;
    ASSERT_TRUE(arch->bind_weights(planner, (*m)->config(), w).ok());
    std::vector<std::string> planned, in_file;
    for (const TensorRequest &r : planner.requests()) planned.push_back(r.name);
    for (int64_t i = 0; i < gguf_get_n_tensors((*m)->file().gguf()); ++i)
      in_file.push_back(gguf_get_tensor_name((*m)->file().gguf(), i));
    EXPECT_EQ(in_file, planned);
  }
}

TEST(ModelRecompute, Gemma4E2BSharedLayers) {
  check_against_recompute(make_model(gemma4_spec("e2b", 6), "g4-e2b.gguf"), 14, 50, 7,
                          kv::RingOrder::Physical, kv::AttentionKernel::Grouped, kGemma4Bound);
}
TEST(ModelRecompute, Gemma4E4BSharedLayers) {
  check_against_recompute(make_model(gemma4_spec("e4b", 7), "g4-e4b.gguf"), 15, 50, 7,
                          kv::RingOrder::Physical, kv::AttentionKernel::Grouped, kGemma4Bound);
}
TEST(ModelRecompute, Gemma4Dense31B) {
  check_against_recompute(make_model(gemma4_spec("31b", 8), "g4-31b.gguf"), 16, 50, 7,
                          kv::RingOrder::Physical, kv::AttentionKernel::Grouped, kGemma4Bound);
}

// Every weight type ggml's CPU backend multiplies loads and decodes like a full recompute.
// Quantized (and f16) matrices round their activations too, so both sides sum attention in the
// same order here: the ring read in logical order, and ggml's flash attention for every span
// (decode chunks would otherwise take the grouped kernel, the recompute ggml's). Physical order
// and the grouped kernel are checked above with f32 weights, where 1e-4 holds across kernels.
TEST(ModelRecompute, EveryWeightType) {
  // ggml's kernels on both sides (AMX q8_0 multiplies sum in another order: the test below).
  set_amx_enabled(false);
  struct Restore {
    ~Restore() { set_amx_enabled(true); }
  } restore;
  for (ggml_type t : {GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q5_0,
                      GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K}) {
    synth::SynthSpec s = synth::preset("small", "muse-glimmer").value();
    s.n_layer = 4, s.n_vocab = 1000, s.window = 12, s.weight_type = t, s.seed = 40 + uint64_t(t);
    const std::string path = make_model(s, std::string("type-") + ggml_type_name(t) + ".gguf");
    auto m = Model::open_metadata(path);
    ASSERT_TRUE(m.ok()) << m.message();
    EXPECT_EQ((*m)->weights().layers[0].wq.w->type, t) << ggml_type_name(t);
    SCOPED_TRACE(ggml_type_name(t));
    // F16 weights: with GGML_LLAMAFILE (as llama.cpp builds ggml), products of 2+ tokens take
    // llamafile's tiled f16 GEMM and single tokens ggml's vec_dot_f16, which sum in other orders;
    // rounding activations to f16 at every layer grows that to 2e-3 here. Every other type holds
    // 1e-4 (the quantized ones come out identical).
    const double tolerance = t == GGML_TYPE_F16 ? 5e-3 : 1e-4;
    check_against_recompute(path, 50, 30, 7, kv::RingOrder::Logical, kv::AttentionKernel::Ggml,
                            tolerance);
    if (HasFatalFailure()) return;
  }
}

// q8_0 weights through AMX tiles (model/amx_matmul.h) against ggml's kernels on the same file and
// prompt, one 40-token span. The products are exact on both sides and only the order of the f32
// block sums differs (1e-7 relative; tests/model/cpu_matmul_test.cpp), but the next layer
// quantizes its activations again: a sum within that much of a rounding boundary moves one
// activation by a whole step, and this random model is sensitive enough that one such step in
// one projection moves a row's logits by up to 8e-3 (measured with AMX on one weight at a time:
// every other row bit-identical; the output head alone, where nothing is quantized after it, 1e-7
// on every row). With every weight on AMX rows differ by about 1.2e-2: bounds 3e-2 median, 5e-2
// worst. A wrong kernel (a scale, a block or a row out of place) moves logits by O(1).
TEST(ModelRecompute, Q8WithAmxTilesAgreesWithGgmlUpToRequantization) {
  if (!amx_available()) GTEST_SKIP() << "no AMX here: " << amx_unavailable_reason();
  synth::SynthSpec s = synth::preset("small", "muse-glimmer").value();
  s.n_layer = 4, s.n_vocab = 1000, s.window = 12, s.weight_type = GGML_TYPE_Q8_0, s.seed = 36;
  const std::string path = make_model(s, "amx-q8_0.gguf");
  constexpr int32_t N = 40;
  std::mt19937_64 rng(36);
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  for (int32_t &t : tokens) t = std::uniform_int_distribution<int32_t>(0, s.n_vocab - 1)(rng);
  auto logits = [&](bool amx) {
    set_amx_enabled(amx);
    Session session(path, N, N);
    const kv::SeqId seq = *session.store->create_sequence();
    Batch b;
    b.tokens = tokens;
    b.spans.push_back({seq, 0, N});
    for (int32_t i = 0; i < N; ++i) b.logit_rows.push_back(i);
    auto l = session.fwd->run(b);
    EXPECT_TRUE(l.ok()) << l.message();
    set_amx_enabled(true);
    return l.ok() ? std::move(l).value() : std::vector<float>();
  };
  const std::vector<float> amx = logits(true), stock = logits(false);
  ASSERT_EQ(amx.size(), size_t(N) * size_t(s.n_vocab));
  ASSERT_EQ(stock.size(), amx.size());
  std::vector<double> errors;
  for (int32_t p = 0; p < N; ++p) {
    const size_t at = size_t(p) * size_t(s.n_vocab);
    errors.push_back(rel_error(amx.data() + at, stock.data() + at, size_t(s.n_vocab)));
  }
  std::vector<double> sorted = errors;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_LE(sorted[sorted.size() / 2], 3e-2);
  EXPECT_LE(sorted.back(), 5e-2);
  EXPECT_GT(sorted.back(), 0.0) << "bit-identical: the AMX path did not run";
  std::printf(
      "[ model    ] q8_0 through AMX tiles vs ggml: first row %.2g, median %.2g, worst %.2g\n",
      errors[0], sorted[sorted.size() / 2], sorted.back());
}

// Decode steps with q8_0 weights: the row-dot kernel (model/cpu_matmul.h) gives the logits of
// ggml's path bit for bit, step after step (its sums are ggml's one-row dot product's, in
// ggml's order), on a file whose every matrix is q8_0. The prompt is one span, through the same
// kernels in both runs.
TEST(ModelDecode, RowDotGivesGgmlsLogitsBitForBit) {
  if (!row_dot_available())
    GTEST_SKIP() << "no row-dot kernel here: " << row_dot_unavailable_reason();
  synth::SynthSpec s = synth::preset("small", "muse-glimmer").value();
  s.n_layer = 4, s.n_vocab = 1000, s.window = 12, s.weight_type = GGML_TYPE_Q8_0, s.seed = 37;
  const std::string path = make_model(s, "row-dot-q8_0.gguf");
  constexpr int32_t kPrompt = 12, kSteps = 16;
  std::mt19937_64 rng(37);
  std::vector<int32_t> tokens(size_t(kPrompt + kSteps));
  for (int32_t &t : tokens) t = std::uniform_int_distribution<int32_t>(0, s.n_vocab - 1)(rng);
  auto decode = [&](bool row_dot) {
    set_row_dot_enabled(row_dot);
    Session session(path, kPrompt + kSteps, kPrompt);
    const kv::SeqId seq = *session.store->create_sequence();
    std::vector<float> all;
    Batch prompt;
    prompt.tokens.assign(tokens.begin(), tokens.begin() + kPrompt);
    prompt.spans.push_back({seq, 0, kPrompt});
    prompt.logit_rows = {kPrompt - 1};
    auto l = session.fwd->run(prompt);
    EXPECT_TRUE(l.ok()) << l.message();
    for (int32_t i = kPrompt; l.ok() && i < kPrompt + kSteps; ++i) {
      Batch b;
      b.tokens = {tokens[size_t(i)]};
      b.spans.push_back({seq, i, 1});
      b.logit_rows = {0};
      l = session.fwd->run(b);
      EXPECT_TRUE(l.ok()) << l.message();
      if (l.ok()) all.insert(all.end(), l->begin(), l->end());
    }
    set_row_dot_enabled(true);
    return all;
  };
  const std::vector<float> own = decode(true), stock = decode(false);
  ASSERT_EQ(own.size(), size_t(kSteps) * size_t(s.n_vocab));
  ASSERT_EQ(stock.size(), own.size());
  for (int32_t step = 0; step < kSteps; ++step) {
    const size_t at = size_t(step) * size_t(s.n_vocab);
    EXPECT_EQ(std::memcmp(own.data() + at, stock.data() + at, size_t(s.n_vocab) * sizeof(float)), 0)
        << "decode step " << step << ": row-dot logits differ from ggml's";
  }
}

// The weights read into anonymous memory and the file's mapping give the same logits, bit for
// bit (the same bytes), and the model says which it holds; a request for the mapping is kept.
TEST(ModelWeights, AnonymousAndMappedWeightsGiveTheSameLogits) {
  synth::SynthSpec s = synth::preset("small", "muse-glimmer").value();
  s.n_layer = 2, s.n_vocab = 1000, s.weight_type = GGML_TYPE_Q8_0, s.seed = 38;
  const std::string path = make_model(s, "weights-storage.gguf");
  auto logits = [&](WeightStorage storage, bool *anonymous) {
    set_weight_storage(storage);
    Session session(path, 16, 8);
    set_weight_storage(WeightStorage::automatic);
    *anonymous = session.model->file().weights_anonymous();
    EXPECT_FALSE(session.model->weight_storage().empty());
    const kv::SeqId seq = *session.store->create_sequence();
    Batch b;
    b.tokens = {3, 1, 4, 1, 5, 9, 2, 6};
    b.spans.push_back({seq, 0, 8});
    b.logit_rows = {7};
    auto l = session.fwd->run(b);
    EXPECT_TRUE(l.ok()) << l.message();
    return l.ok() ? std::move(l).value() : std::vector<float>();
  };
  bool anonymous = false, mapped_anonymous = true;
  const std::vector<float> a = logits(WeightStorage::anonymous, &anonymous);
  const std::vector<float> m = logits(WeightStorage::mapped, &mapped_anonymous);
  EXPECT_TRUE(anonymous);
  EXPECT_FALSE(mapped_anonymous);
  ASSERT_EQ(a.size(), size_t(s.n_vocab));
  ASSERT_EQ(m.size(), a.size());
  EXPECT_EQ(std::memcmp(a.data(), m.data(), a.size() * sizeof(float)), 0);
}

TEST(ModelBatch, TwoSequencesInOneBatchMatchEachAlone) {
  const std::string path = make_model(small_spec("muse-glimmer", false, 4), "mg-batch.gguf");
  Session s(path, 64, 8);
  std::mt19937_64 rng(21);
  const int32_t V = s.model->config().n_vocab;
  auto rand_tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t &x : t) x = std::uniform_int_distribution<int32_t>(0, V - 1)(rng);
    return t;
  };
  const kv::SeqId a = *s.store->create_sequence(), b = *s.store->create_sequence();
  const kv::SeqId a2 = *s.store->create_sequence(), b2 = *s.store->create_sequence();
  for (int step = 0; step < 12; ++step) {
    const auto ta = rand_tokens(step % 3 == 0 ? 5 : 1), tb = rand_tokens(step % 4 == 0 ? 7 : 1);
    Batch both;
    both.tokens = ta;
    both.tokens.insert(both.tokens.end(), tb.begin(), tb.end());
    both.spans = {{a, s.store->sequence(a)->length(), int32_t(ta.size())},
                  {b, s.store->sequence(b)->length(), int32_t(tb.size())}};
    both.logit_rows = {int32_t(ta.size()) - 1, int32_t(both.tokens.size()) - 1};
    auto lb = s.fwd->run(both);
    ASSERT_TRUE(lb.ok()) << lb.message();
    Batch ba{
        ta, {{a2, s.store->sequence(a2)->length(), int32_t(ta.size())}}, {int32_t(ta.size()) - 1}};
    Batch bb{
        tb, {{b2, s.store->sequence(b2)->length(), int32_t(tb.size())}}, {int32_t(tb.size()) - 1}};
    auto la = s.fwd->run(ba), lbb = s.fwd->run(bb);
    ASSERT_TRUE(la.ok() && lbb.ok());
    EXPECT_LE(rel_error(lb->data(), la->data(), size_t(V)), 1e-5) << step;
    EXPECT_LE(rel_error(lb->data() + V, lbb->data(), size_t(V)), 1e-5) << step;
  }
}

// A pass that wants no logits (every prompt chunk but the last) fills the cache exactly as one
// that wants the last row, and computes less: no node reads the output head, and the last layer
// attends nowhere (only its K/V writes are needed). Checked on both architectures and both
// attention kernels, by the logits of the chunk after it (bit for bit) and the nodes computed.
// `n_layer` 4 makes the last layer the only global one: its mask is then an input no node of a
// pass without logits reads (never allocated, never uploaded).
void check_no_logit_pass(const std::string &arch, kv::AttentionKernel kernel, int32_t n_layer) {
  synth::SynthSpec spec = small_spec(arch, false, 9);
  spec.n_layer = n_layer;
  const std::string path =
      make_model(spec, arch + "-nologits-" + std::to_string(n_layer) + ".gguf");
  Session with(path, 96, 24), without(path, 96, 24);
  with.store->set_attention_kernel(kernel), without.store->set_attention_kernel(kernel);
  const ModelConfig &c = with.model->config();
  std::mt19937_64 rng(29);
  std::vector<int32_t> tokens(70);
  for (int32_t &t : tokens) t = std::uniform_int_distribution<int32_t>(0, c.n_vocab - 1)(rng);
  const kv::SeqId a = *with.store->create_sequence(), b = *without.store->create_sequence();
  struct Seen {
    int attention = 0, writes = 0, head = 0, nodes = 0;
  };
  auto observe = [&](Session &s, Seen &seen) {
    s.fwd->set_node_observer([&seen, &s](const ggml_tensor *node, double) {
      ++seen.nodes;
      const std::string name = ggml_get_name(node);
      seen.attention += name == "tiled_attention" || name == "grouped_attention" ||
                        node->op == GGML_OP_FLASH_ATTN_EXT;
      seen.writes += node->op == GGML_OP_SET_ROWS;
      for (const ggml_tensor *src : node->src)
        seen.head += src && src == s.model->weights().output.w;
    });
  };
  for (int32_t at = 0; at < int32_t(tokens.size()); at += 20) {
    const int32_t n = std::min<int32_t>(20, int32_t(tokens.size()) - at);
    const bool last = at + n == int32_t(tokens.size());
    Batch bw{{tokens.begin() + at, tokens.begin() + at + n}, {{a, at, n}}, {n - 1}};
    Batch bn{bw.tokens, {{b, at, n}}, {}};
    if (last) bn.logit_rows = {n - 1};
    Seen sw, sn;
    observe(with, sw), observe(without, sn);
    auto lw = with.fwd->run(bw), ln = without.fwd->run(bn);
    ASSERT_TRUE(lw.ok()) << lw.message();
    ASSERT_TRUE(ln.ok()) << ln.message();
    EXPECT_EQ(sw.writes, 2 * c.n_layer);
    EXPECT_EQ(sw.attention, c.n_layer);
    EXPECT_GT(sw.head, 0);
    if (last) {
      EXPECT_EQ(*lw, *ln) << "the chunk after passes that wanted no logits";
      continue;
    }
    EXPECT_TRUE(ln->empty());
    EXPECT_EQ(sn.writes, 2 * c.n_layer) << "every layer's K/V still written, at " << at;
    EXPECT_EQ(sn.attention, c.n_layer - 1) << "the last layer attends nowhere, at " << at;
    EXPECT_EQ(sn.head, 0) << "no node reads the head, at " << at;
    EXPECT_LT(sn.nodes, sw.nodes);
  }
  EXPECT_EQ(with.store->sequence(a)->length(), int32_t(tokens.size()));
  EXPECT_EQ(without.store->sequence(b)->length(), int32_t(tokens.size()));
}

TEST(ModelNoLogits, MuseGlimmerTiled) {
  check_no_logit_pass("muse-glimmer", kv::AttentionKernel::Grouped, 5);
}
TEST(ModelNoLogits, MuseGlimmerLastLayerGlobal) {
  check_no_logit_pass("muse-glimmer", kv::AttentionKernel::Grouped, 4);
  check_no_logit_pass("muse-glimmer", kv::AttentionKernel::Ggml, 4);
}
TEST(ModelNoLogits, LlamaTiled) { check_no_logit_pass("llama", kv::AttentionKernel::Grouped, 5); }
TEST(ModelNoLogits, MuseGlimmerGgml) {
  check_no_logit_pass("muse-glimmer", kv::AttentionKernel::Ggml, 5);
}

// Hidden states (Batch::hidden_layers, what a drafter conditioned on the target reads): layer 0's
// input is the embedded token itself (Muse Glimmer: RMS-normalised without a gain; Llama: the raw
// row), against the file's embedding read directly; every layer's input for a token is the same
// whether its prompt went in as one span or token by token; asking for them changes no logit.
void check_hidden_states(const std::string &arch) {
  const std::string path = make_model(small_spec(arch, false, 8), arch + "-hidden.gguf");
  Session s(path, 64, 16);
  const ModelConfig &c = s.model->config();
  std::mt19937_64 rng(23);
  std::vector<int32_t> tokens(12);
  for (int32_t &t : tokens) t = std::uniform_int_distribution<int32_t>(0, c.n_vocab - 1)(rng);
  const std::vector<int32_t> layers = {0, 2, c.n_layer - 1};
  const size_t E = size_t(c.n_embd), n = tokens.size();

  const kv::SeqId whole = *s.store->create_sequence(), one = *s.store->create_sequence(),
                  plain = *s.store->create_sequence();
  Batch b{tokens, {{whole, 0, int32_t(n)}}, {int32_t(n) - 1}, layers};
  std::vector<std::vector<float>> hidden;
  auto logits = s.fwd->run(b, &hidden);
  ASSERT_TRUE(logits.ok()) << logits.message();
  ASSERT_EQ(hidden.size(), layers.size());
  for (const auto &h : hidden) ASSERT_EQ(h.size(), n * E);
  Batch without{tokens, {{plain, 0, int32_t(n)}}, {int32_t(n) - 1}};
  auto plain_logits = s.fwd->run(without);
  ASSERT_TRUE(plain_logits.ok());
  EXPECT_EQ(*logits, *plain_logits);

  // Layer 0 against the embedding table.
  const ggml_tensor *emb = s.model->weights().tok_embd;
  const auto *traits = ggml_get_type_traits(emb->type);
  std::vector<char> raw(emb->nb[1]);
  std::vector<float> row(E);
  for (size_t t = 0; t < n; ++t) {
    ggml_backend_tensor_get(emb, raw.data(), size_t(tokens[t]) * emb->nb[1], emb->nb[1]);
    if (emb->type == GGML_TYPE_F32)
      std::memcpy(row.data(), raw.data(), E * sizeof(float));
    else
      traits->to_float(raw.data(), row.data(), int64_t(E));
    double ms = 0;
    for (float x : row) ms += double(x) * x;
    const double scale = arch == "muse-glimmer" ? 1.0 / std::sqrt(ms / double(E) + c.rms_eps) : 1.0;
    for (size_t d = 0; d < E; ++d)
      ASSERT_NEAR(hidden[0][t * E + d], row[d] * scale,
                  1e-4 * std::max(1.0, std::fabs(row[d] * scale)))
          << "token " << t << ", dimension " << d;
  }
  // Token by token: the same states (f32 cache; rounding of a one-row product aside).
  for (size_t t = 0; t < n; ++t) {
    Batch step{{tokens[t]}, {{one, int32_t(t), 1}}, {0}, layers};
    std::vector<std::vector<float>> h;
    ASSERT_TRUE(s.fwd->run(step, &h).ok());
    for (size_t l = 0; l < layers.size(); ++l)
      EXPECT_LE(rel_error(h[l].data(), hidden[l].data() + t * E, E), 1e-5)
          << "layer " << layers[l] << ", token " << t;
  }
  // Deeper layers are not the embedding: the states change through the stack.
  EXPECT_GT(rel_error(hidden[2].data(), hidden[0].data(), n * E), 1e-2);
  // Bad lists are refused by name.
  for (std::vector<int32_t> bad :
       {std::vector<int32_t>{c.n_layer}, std::vector<int32_t>{2, 1}, std::vector<int32_t>{-1}}) {
    Batch x{{tokens[0]}, {{one, int32_t(n), 1}}, {0}, bad};
    std::vector<std::vector<float>> h;
    auto r = s.fwd->run(x, &h);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find("hidden layers"), std::string::npos) << r.message();
  }
}

TEST(ModelHidden, MuseGlimmerLayerInputs) { check_hidden_states("muse-glimmer"); }
TEST(ModelHidden, LlamaLayerInputs) { check_hidden_states("llama"); }

// ---- malformed files ----------------------------------------------------------------------

// Rewrites a GGUF through the gguf API, letting `edit` change metadata; `skip` drops a tensor.
// A copy of a GGUF being written: its tensors (with data) and keys in `in`/`data`, the new file
// in `out` (the keys copied), new tensors in `extra`. write() saves it under temp_dir().
struct Rewrite {
  ggml_context *data = nullptr, *extra = nullptr;
  gguf_context *in = nullptr, *out = nullptr;
  Rewrite(const std::string &src, ggml_init_params extra_params) {
    gguf_init_params p = {false, &data};
    in = gguf_init_from_file(src.c_str(), p);
    EXPECT_TRUE(in);
    out = gguf_init_empty();
    gguf_set_kv(out, in);
    extra = ggml_init(extra_params);
  }
  ~Rewrite() {
    gguf_free(out);
    gguf_free(in);
    ggml_free(data);
    ggml_free(extra);
  }
  ggml_tensor *get(const std::string &name) const { return ggml_get_tensor(data, name.c_str()); }
  std::string write(const std::string &name) const {
    const std::string path = (temp_dir() / name).string();
    EXPECT_TRUE(gguf_write_to_file(out, path.c_str(), false));
    return path;
  }
};

std::string rewrite(const std::string &src, const std::string &name,
                    const std::function<void(gguf_context *)> &edit, const std::string &skip = "",
                    const std::string &reshape = "") {
  Rewrite r(src, {ggml_tensor_overhead() * 4, nullptr, true});
  gguf_context *in = r.in, *out = r.out;
  ggml_context *extra = r.extra;
  edit(out);
  for (int64_t i = 0; i < gguf_get_n_tensors(in); ++i) {
    const std::string tn = gguf_get_tensor_name(in, i);
    if (tn == skip) continue;
    ggml_tensor *t = r.get(tn);
    if (tn == reshape) { // same bytes, other shape: [ne0 / 2, ne1 * 2]
      ggml_tensor *re = ggml_new_tensor_2d(extra, t->type, t->ne[0] / 2, t->ne[1] * 2);
      ggml_set_name(re, tn.c_str());
      re->data = t->data;
      t = re;
    }
    gguf_add_tensor(out, t);
  }
  return r.write(name);
}

void expect_error(const std::string &path, const std::string &mentions) {
  auto m = Model::load(path);
  ASSERT_FALSE(m.ok()) << path << " loaded, expected an error mentioning '" << mentions << "'";
  EXPECT_NE(m.message().find(mentions), std::string::npos) << m.message();
}

class Malformed : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    good_ = make_model(small_spec("muse-glimmer", true, 5), "good.gguf");
  }
  static std::string good_;
};
std::string Malformed::good_;

TEST_F(Malformed, TheGoodFileLoads) { EXPECT_TRUE(Model::load(good_).ok()); }

TEST_F(Malformed, TruncatedDataIsNamed) {
  const std::string path = (temp_dir() / "truncated.gguf").string();
  fs::copy_file(good_, path, fs::copy_options::overwrite_existing);
  fs::resize_file(path, fs::file_size(path) / 2);
  expect_error(path, "holds no weights");
}

TEST_F(Malformed, TruncatedHeaderIsNamed) {
  const std::string path = (temp_dir() / "header.gguf").string();
  fs::copy_file(good_, path, fs::copy_options::overwrite_existing);
  fs::resize_file(path, 100);
  expect_error(path, "malformed GGUF");
}

TEST_F(Malformed, NotGguf) {
  const std::string path = (temp_dir() / "junk.gguf").string();
  std::ofstream(path) << "this is not a model file at all";
  expect_error(path, "not a GGUF file");
  expect_error((temp_dir() / "absent.gguf").string(), "cannot open");
}

TEST_F(Malformed, MissingKey) {
  expect_error(
      rewrite(good_, "nokey.gguf",
              [](gguf_context *c) { gguf_remove_key(c, "muse-glimmer.attention.sliding_window"); }),
      "'muse-glimmer.attention.sliding_window' is missing");
}

TEST_F(Malformed, WrongKeyType) {
  expect_error(rewrite(good_, "keytype.gguf",
                       [](gguf_context *c) {
                         gguf_remove_key(c, "muse-glimmer.block_count");
                         gguf_set_val_str(c, "muse-glimmer.block_count", "five");
                       }),
               "'muse-glimmer.block_count' should be u32");
}

TEST_F(Malformed, UnknownArchitecture) {
  expect_error(
      rewrite(good_, "arch.gguf",
              [](gguf_context *c) { gguf_set_val_str(c, "general.architecture", "mamba"); }),
      "'mamba' is not supported");
}

TEST_F(Malformed, WrongShapeForTheHyperparameters) {
  // 4 KV heads of 32 make attn_k [64, 128] where the file's is [64, 64].
  expect_error(rewrite(good_, "heads.gguf",
                       [](gguf_context *c) {
                         gguf_set_val_u32(c, "muse-glimmer.attention.head_count_kv", 4);
                       }),
               "tensor 'blk.0.attn_k.weight' has shape [64, 64], expected [64, 128]");
  expect_error(rewrite(
                   good_, "reshaped.gguf", [](gguf_context *) {}, "", "blk.2.ffn_up.weight"),
               "tensor 'blk.2.ffn_up.weight' has shape [32, 192], expected [64, 96]");
}

TEST_F(Malformed, MissingTensor) {
  expect_error(rewrite(
                   good_, "notensor.gguf", [](gguf_context *) {}, "blk.3.attn_gate.weight"),
               "tensor 'blk.3.attn_gate.weight' is missing");
}

TEST_F(Malformed, PatternArrayOfTheWrongLength) {
  expect_error(rewrite(good_, "pattern.gguf",
                       [](gguf_context *c) {
                         const uint8_t three[3] = {1, 1, 0};
                         gguf_set_arr_data(c, "muse-glimmer.attention.sliding_window_pattern",
                                           GGUF_TYPE_BOOL, three, 3);
                       }),
               "has 3 entries for 5 layers");
}

// Gemma 4 files: what the architecture cannot run is refused by name, never guessed at.
class MalformedGemma4 : public ::testing::Test {
protected:
  static void SetUpTestSuite() { good_ = make_model(gemma4_spec("e2b", 9), "g4-good.gguf"); }
  static std::string edited(const std::string &name,
                            const std::function<void(gguf_context *)> &edit) {
    return rewrite(good_, name, edit);
  }
  static std::string good_;
};
std::string MalformedGemma4::good_;

TEST_F(MalformedGemma4, TheGoodFileLoadsWithItsDonors) {
  auto m = Model::load(good_);
  ASSERT_TRUE(m.ok()) << m.message();
  const cache::Geometry &g = (*m)->geometry();
  EXPECT_EQ(g.n_caches(), 5);
  for (int32_t il = 5; il < 10; ++il)
    EXPECT_EQ(g.cache(g.cache_of_layer(il)).owner_layer, il % 5 == 4 ? 4 : 3) << il;
}

TEST_F(MalformedGemma4, MixtureOfExpertsIsRefused) {
  expect_error(edited("g4-moe.gguf",
                      [](gguf_context *c) { gguf_set_val_u32(c, "gemma4.expert_count", 128); }),
               "mixture-of-experts gemma4 files (26B-A4B) are not supported");
}

TEST_F(MalformedGemma4, PatternIsRequiredPerLayer) {
  expect_error(edited("g4-nopattern.gguf",
                      [](gguf_context *c) {
                        gguf_remove_key(c, "gemma4.attention.sliding_window_pattern");
                      }),
               "'gemma4.attention.sliding_window_pattern' (a bool per layer) is missing");
  expect_error(edited("g4-shortpattern.gguf",
                      [](gguf_context *c) {
                        const uint8_t three[3] = {1, 1, 0};
                        gguf_set_arr_data(c, "gemma4.attention.sliding_window_pattern",
                                          GGUF_TYPE_BOOL, three, 3);
                      }),
               "has 3 entries for 10 layers");
}

// 4 shared layers leave layers 4 (global) and 5 (sliding) as the last owners: transformers'
// donors (the last of each kind) and llama.cpp's (n_kv - 2 sliding, n_kv - 1 global) differ.
TEST_F(MalformedGemma4, SharedLayersWhoseDonorsAreAmbiguous) {
  expect_error(
      edited("g4-donors.gguf",
             [](gguf_context *c) { gguf_set_val_u32(c, "gemma4.attention.shared_kv_layers", 4); }),
      "must be a sliding then a global one");
}

TEST_F(MalformedGemma4, PerLayerEmbeddingWidthIsRequired) {
  expect_error(edited("g4-nople.gguf",
                      [](gguf_context *c) {
                        gguf_remove_key(c, "gemma4.embedding_length_per_layer_input");
                      }),
               "'gemma4.embedding_length_per_layer_input' is missing");
}

TEST_F(MalformedGemma4, UnequalKAndVHeadSizes) {
  expect_error(
      edited("g4-kv.gguf",
             [](gguf_context *c) { gguf_set_val_u32(c, "gemma4.attention.value_length_swa", 16); }),
      "gemma4 needs equal K and V head sizes");
}

TEST_F(MalformedGemma4, MissingPerLayerProjection) {
  expect_error(rewrite(
                   good_, "g4-noproj.gguf", [](gguf_context *) {}, "per_layer_model_proj.weight"),
               "tensor 'per_layer_model_proj.weight' is missing");
}

// The fused attn_qkv projection (llama.cpp reads both forms): the same weights stored as one
// [E, QW + KW + VW] tensor, with one fused bias or with the three separate ones, and one scale,
// give the logits of separate attn_q/k/v with their biases and that scale each. Rows of a weight
// are independent, so the fused tensor is the three tensors' bytes one after another. The
// biases are drawn once (seeded by name).
enum class QkvForm { Separate, FusedBias, FusedSeparateBiases };

std::string write_qkv_form(const std::string &src, const std::string &name, QkvForm form) {
  Rewrite r(src, {size_t(64) << 20, nullptr, false});
  gguf_context *in = r.in, *out = r.out;
  ggml_context *extra = r.extra;
  auto get = [&](const std::string &n) { return r.get(n); };
  auto bias = [&](const std::string &n, int64_t len) {
    ggml_tensor *b = ggml_new_tensor_1d(extra, GGML_TYPE_F32, len);
    ggml_set_name(b, n.c_str());
    std::mt19937_64 rng(std::hash<std::string>()(n));
    std::normal_distribution<float> d(0.0f, 0.5f);
    for (int64_t i = 0; i < len; ++i) static_cast<float *>(b->data)[i] = d(rng);
    return b;
  };
  auto concat = [&](const std::string &n, std::initializer_list<ggml_tensor *> parts) {
    int64_t rows = 0;
    for (ggml_tensor *t : parts) rows += ggml_n_dims(t) == 2 ? t->ne[1] : t->ne[0];
    ggml_tensor *a = *parts.begin();
    ggml_tensor *f = ggml_n_dims(a) == 2 ? ggml_new_tensor_2d(extra, a->type, a->ne[0], rows)
                                         : ggml_new_tensor_1d(extra, a->type, rows);
    ggml_set_name(f, n.c_str());
    size_t at = 0;
    for (ggml_tensor *t : parts) {
      std::memcpy(static_cast<char *>(f->data) + at, t->data, ggml_nbytes(t));
      at += ggml_nbytes(t);
    }
    return f;
  };
  auto scale = [&](const std::string &n) {
    ggml_tensor *s = ggml_new_tensor_1d(extra, GGML_TYPE_F32, 1);
    ggml_set_name(s, n.c_str());
    *static_cast<float *>(s->data) = 1.7f;
    return s;
  };
  for (int64_t i = 0; i < gguf_get_n_tensors(in); ++i) {
    const std::string tn = gguf_get_tensor_name(in, i);
    const size_t at = tn.find("attn_q.weight");
    if (at == std::string::npos) {
      if (tn.find("attn_k.weight") == std::string::npos &&
          tn.find("attn_v.weight") == std::string::npos)
        gguf_add_tensor(out, get(tn));
      continue;
    }
    const std::string b = tn.substr(0, at); // "blk.N."
    ggml_tensor *q = get(tn), *k = get(b + "attn_k.weight"), *v = get(b + "attn_v.weight");
    ggml_tensor *qb = bias(b + "attn_q.bias", q->ne[1]), *kb = bias(b + "attn_k.bias", k->ne[1]),
                *vb = bias(b + "attn_v.bias", v->ne[1]);
    if (form == QkvForm::Separate) {
      for (ggml_tensor *t : {q, k, v, qb, kb, vb}) gguf_add_tensor(out, t);
      for (const char *x : {"attn_q.scale", "attn_k.scale", "attn_v.scale"})
        gguf_add_tensor(out, scale(b + x));
      continue;
    }
    gguf_add_tensor(out, concat(b + "attn_qkv.weight", {q, k, v}));
    gguf_add_tensor(out, scale(b + "attn_qkv.scale"));
    if (form == QkvForm::FusedBias)
      gguf_add_tensor(out, concat(b + "attn_qkv.bias", {qb, kb, vb}));
    else
      for (ggml_tensor *t : {qb, kb, vb}) gguf_add_tensor(out, t);
  }
  return r.write(name);
}

std::vector<float> prompt_logits(const std::string &path, const std::vector<int32_t> &tokens) {
  Session s(path, int32_t(tokens.size()), 8);
  std::mt19937_64 rng(3);
  return incremental(s, *s.store->create_sequence(), tokens, rng, 8);
}

TEST(ModelFiles, FusedQkvComputesTheSeparateProjections) {
  for (const char *arch : {"llama", "muse-glimmer"}) {
    SCOPED_TRACE(arch);
    const std::string a = arch;
    const std::string base = make_model(small_spec(arch, true, 21), a + "-base.gguf");
    std::vector<int32_t> tokens(30);
    std::mt19937_64 rng(5);
    for (int32_t &t : tokens) t = std::uniform_int_distribution<int32_t>(0, 299)(rng);
    const auto plain = prompt_logits(base, tokens);
    const auto want =
        prompt_logits(write_qkv_form(base, a + "-sep.gguf", QkvForm::Separate), tokens);
    ASSERT_FALSE(want.empty());
    // The biases and scales matter (else this test could not see them dropped).
    EXPECT_GT(rel_error(plain.data(), want.data(), want.size()), 1e-3);
    for (QkvForm form : {QkvForm::FusedBias, QkvForm::FusedSeparateBiases}) {
      const std::string fused =
          write_qkv_form(base, a + "-fused" + std::to_string(int(form)) + ".gguf", form);
      auto m = Model::open_metadata(fused);
      ASSERT_TRUE(m.ok()) << m.message();
      ASSERT_TRUE((*m)->weights().layers[0].wqkv.w);
      const auto got = prompt_logits(fused, tokens);
      ASSERT_EQ(got.size(), want.size());
      const double err = rel_error(got.data(), want.data(), got.size());
      EXPECT_LE(err, 1e-6) << "form " << int(form);
      std::printf("[ model    ] %s fused qkv (form %d): relative error %.2g against separate "
                  "(bound 1e-6)\n",
                  arch, int(form), err);
    }
  }
}

// The compute limit on the CPU alone (ggml's allocator, measured before it grows).
TEST(ModelDecode, TheComputeLimitRefusesAGraphBeforeItsBufferGrows) {
  const std::string path = testing::make_model("muse-glimmer", 8);
  testing::Session limited(path, nullptr), ref(path, nullptr);
  testing::check_compute_limit(limited, ref);
}

} // namespace
} // namespace offgraph::model
