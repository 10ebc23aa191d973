// KvStore: growth, donor sharing, memory accounting and refusals, each against an independent
// expectation (a store allocated at full size, recomputed K/V, hand arithmetic).
#include "store_util.h"

#include "ggml-cpu.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace offgraph::kv {
namespace {

using cache::CacheId;
using testing::layer;
using testing::make_layout;
using testing::make_store;
using testing::random_inputs;
using testing::run_step;

TEST(KvStore, PagedStorageGivesTheOutputsOfOnePage) {
  // Pages of one row, in a store where a second sequence takes every other page, against one page
  // holding the whole capacity (contiguous rows): the kernels see the same rows, bit for bit.
  // (Groups of 4 and 8: the grouped kernel on both sides; Pages.EveryKernel* covers the others.)
  const std::vector<cache::LayerSpec> layers = {layer(0), layer(6), layer(0, 1, 32, 96)};
  auto paged = make_store(make_layout(layers, 0, {300, 7, 1}), {GGML_TYPE_F16, GGML_TYPE_Q8_0});
  auto whole = make_store(make_layout(layers, 0, {300, 7, 300}), {GGML_TYPE_F16, GGML_TYPE_Q8_0});
  const SeqId a = *paged->create_sequence(), other = *paged->create_sequence();
  const SeqId b = *whole->create_sequence();
  std::mt19937_64 rng(42);
  while (paged->sequence(a)->length() < 300) {
    const int32_t room = 300 - paged->sequence(a)->length();
    const int32_t n = std::min(room, std::uniform_int_distribution<int32_t>(1, 7)(rng));
    auto in = random_inputs(rng, paged->layout(), n, 8);
    auto out_paged = run_step(*paged, a, n, in);
    ASSERT_EQ(out_paged, run_step(*whole, b, n, in))
        << "at length " << paged->sequence(a)->length();
    run_step(*paged, other, n, in); // interleaves the two sequences' pages
    EXPECT_EQ(paged->storage_rows(a, 0), paged->sequence(a)->length()); // a page a row
  }
  EXPECT_EQ(whole->storage_rows(b, 0), 300);
  EXPECT_EQ(paged->storage_rows(a, 1), 6 + 7 - 1); // the ring never grows
  // The interleaving scattered a's pages: they are not simply 0, 1, 2, ...
  const std::vector<cache::PageId> &pages = paged->page_table(a)->pages;
  std::vector<cache::PageId> in_order(pages.size());
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_NE(pages, in_order);
}

// A token's attention is the same bits decoded alone or as the first of a span of up to 8 (the
// grouped kernel; what speculative verification runs): the span's other tokens see rows the first
// does not, which must not change how the first one's sums are formed. Over a ring that wraps
// (window 20) and a flat cache, V rows of 128 (the tiled weighted sums), groups of 4 and 2.
TEST(KvStore, ATokenAloneAndFirstInASpanGiveTheSameBits) {
  const std::vector<cache::LayerSpec> layers = {layer(20, 2, 64, 128), layer(0, 2, 64, 128),
                                                layer(20, 4, 64, 128)};
  auto alone = make_store(make_layout(layers, 0, {200, 8, 16}), {GGML_TYPE_F16, GGML_TYPE_F16});
  auto spans = make_store(make_layout(layers, 0, {200, 8, 16}), {GGML_TYPE_F16, GGML_TYPE_F16});
  const SeqId a = *alone->create_sequence(), b = *spans->create_sequence();
  std::mt19937_64 rng(11);
  int compared = 0;
  while (alone->sequence(a)->length() + 8 <= 200) {
    const int32_t n = std::uniform_int_distribution<int32_t>(1, 6)(rng);
    auto history = random_inputs(rng, alone->layout(), n, 8);
    run_step(*alone, a, n, history);
    run_step(*spans, b, n, history);
    // One token alone, and the same token first in a span of k.
    const int32_t k = std::uniform_int_distribution<int32_t>(2, 8)(rng);
    auto one = random_inputs(rng, alone->layout(), 1, 8);
    auto many = random_inputs(rng, spans->layout(), k, 8);
    for (size_t l = 0; l < one.size(); ++l) {
      std::copy(one[l].q.begin(), one[l].q.end(), many[l].q.begin());
      std::copy(one[l].k.begin(), one[l].k.end(), many[l].k.begin());
      std::copy(one[l].v.begin(), one[l].v.end(), many[l].v.begin());
    }
    const int32_t at = alone->sequence(a)->length();
    auto out_one = run_step(*alone, a, 1, one);
    auto out_many = run_step(*spans, b, k, many);
    for (size_t l = 0; l < layers.size(); ++l) {
      ASSERT_EQ(out_many[l].size(), out_one[l].size() * size_t(k));
      for (size_t i = 0; i < out_one[l].size(); ++i)
        ASSERT_EQ(out_one[l][i], out_many[l][i]) << "layer " << l << " at " << at << " span " << k;
    }
    ++compared;
    ASSERT_TRUE(spans->rewind(b, at + 1).ok()); // both hold the same history again
  }
  EXPECT_GT(compared, 20);
}

TEST(KvStore, SharedLayersMatchRecomputedKVAndHoldNoStorage) {
  // Layers 2 and 3 share the caches of 0 (sliding) and 1 (full).
  const std::vector<cache::LayerSpec> layers = {layer(5), layer(0), layer(5), layer(0)};
  auto shared = make_store(make_layout(layers, 2, {64, 4, 8}), {GGML_TYPE_F16, GGML_TYPE_F16});
  auto own = make_store(make_layout(layers, 0, {64, 4, 8}), {GGML_TYPE_F16, GGML_TYPE_F16});
  ASSERT_EQ(shared->layout().n_caches(), 2);
  ASSERT_EQ(own->layout().n_caches(), 4);
  const SeqId a = *shared->create_sequence(), b = *own->create_sequence();
  std::mt19937_64 rng(7);
  for (int i = 0; i < 30; ++i) {
    const int32_t n = i % 3 == 0 ? 4 : 1;
    // The unshared model recomputes layers 2 and 3's K/V; they equal the donors' (as in YOCO).
    auto in = random_inputs(rng, shared->layout(), n, 4);
    ASSERT_EQ(run_step(*shared, a, n, in), run_step(*own, b, n, in)) << "step " << i;
  }
  EXPECT_EQ(shared->memory().held * 2, own->memory().held);
  for (CacheId c = 0; c < 2; ++c) EXPECT_NE(shared->k_storage(a, c), nullptr);
}

TEST(KvStore, BytesHeldFollowTheFormula) {
  // Two KV heads; K dim 64, V dim 32; window 6 with max_write 7 -> ring of 12 rows; pages of 8.
  const std::vector<cache::LayerSpec> layers = {layer(0), layer(6), layer(0)};
  auto store = make_store(make_layout(layers, 0, {1024, 7, 8}), {GGML_TYPE_Q8_0, GGML_TYPE_F16});
  const SeqId s = *store->create_sequence();
  // q8_0 stores 32 values in 34 bytes; f16 2 bytes a value.
  const int64_t k_row = 2 * 64 / 32 * 34, v_row = 2 * 32 * 2, row = k_row + v_row;
  const int64_t ring = 12 * row;
  EXPECT_EQ(store->page_bytes(), 2 * 8 * row); // a page: 8 rows of both flat caches
  MemoryUse m = store->memory(s);
  EXPECT_EQ(m.ring, ring); // allocated up front
  EXPECT_EQ(m.flat, 0);    // no page before the first write
  EXPECT_EQ(m.held, m.flat + m.ring);
  std::mt19937_64 rng(3);
  for (int32_t length = 0; length < 64;) {
    const int32_t n = std::min(7, 64 - length);
    run_step(*store, s, n, random_inputs(rng, store->layout(), n, 2));
    length += n;
    m = store->memory(s);
    const int64_t pages = (length + 7) / 8;
    EXPECT_EQ(m.pages, pages);
    EXPECT_EQ(store->storage_rows(s, 0), pages * 8);
    EXPECT_EQ(m.flat, 2 * pages * 8 * row);
    EXPECT_EQ(m.k, (2 * pages * 8 + 12) * k_row);
    EXPECT_EQ(m.v, (2 * pages * 8 + 12) * v_row);
    EXPECT_EQ(m.k + m.v, m.held);
    // The minimum: every position on full layers, the window on the ring.
    EXPECT_EQ(m.minimum, (2 * int64_t(length) + std::min<int64_t>(length, 6)) * row);
    // At most a page of slack past the flat caches' fill, and the ring's reach (6 rows).
    EXPECT_LT(m.held - m.minimum, (2 * 8 + 6) * row + 1);
    EXPECT_GE(m.buffers, m.held);
    EXPECT_LT(m.buffers - m.held, 6 * 64); // only the ring buffer's alignment padding
    // One sequence: the store-wide figures are its own.
    EXPECT_EQ(store->memory().held, m.held);
    EXPECT_EQ(store->memory().minimum, m.minimum);
  }
  // At a page boundary the flat caches hold exactly what they need: bytes held = the minimum and
  // the ring's reach.
  ASSERT_EQ(store->sequence(s)->length(), 64);
  EXPECT_EQ(store->memory(s).held, store->memory(s).minimum + 6 * row);
}

TEST(KvStore, GrowthPastTheBudgetFailsAndChangesNothing) {
  const std::vector<cache::LayerSpec> layers = {layer(0)};
  auto store = make_store(make_layout(layers, 0, {4096, 8, 8}), {GGML_TYPE_F32, GGML_TYPE_F32});
  const SeqId s = *store->create_sequence();
  const int64_t row = 2 * 64 * 4 + 2 * 32 * 4;
  store->set_memory_budget(2 * 8 * row + 8 * row / 2); // two pages fit, not three
  std::mt19937_64 rng(5);
  for (int i = 0; i < 2; ++i) run_step(*store, s, 8, random_inputs(rng, store->layout(), 8, 2));
  ASSERT_EQ(store->storage_rows(s, 0), 16);
  const MemoryUse before = store->memory(s);
  Step step(*store);
  auto span = step.add_span({s, 16, 1});
  ASSERT_FALSE(span.ok());
  EXPECT_NE(span.message().find("memory budget"), std::string::npos) << span.message();
  EXPECT_EQ(store->sequence(s)->length(), 16);
  EXPECT_EQ(store->storage_rows(s, 0), 16);
  EXPECT_EQ(store->memory(s).buffers, before.buffers);
  // The sequence still works where its storage allows: rewind and decode again.
  ASSERT_TRUE(store->rewind(s, 15).ok());
  EXPECT_EQ(run_step(*store, s, 1, random_inputs(rng, store->layout(), 1, 2)).size(), 1u);
}

TEST(KvStore, ForkIsRefusedWhenTheRingNoLongerHoldsTheWindow) {
  const std::vector<cache::LayerSpec> layers = {layer(4), layer(0)};
  auto store = make_store(make_layout(layers, 0, {128, 2, 8}), {GGML_TYPE_F16, GGML_TYPE_F16});
  const SeqId s = *store->create_sequence();
  std::mt19937_64 rng(9);
  for (int i = 0; i < 12; ++i) run_step(*store, s, 1, random_inputs(rng, store->layout(), 1, 2));
  auto refused = store->fork(s, 9);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("restore a snapshot"), std::string::npos) << refused.message();
  EXPECT_EQ(store->sequence_ids().size(), 1u);
  auto child = store->fork(s, 10);
  ASSERT_TRUE(child.ok()) << child.message();
  EXPECT_EQ(store->sequence(*child)->length(), 10);
}

TEST(KvStore, RestoreThenDecodeEqualsNeverHavingMoved) {
  // Snapshot at a prompt boundary, generate past the ring, restore, decode: the outputs must equal
  // those of a fork taken at the boundary (which never moved), bit for bit.
  const std::vector<cache::LayerSpec> layers = {layer(4), layer(0), layer(3)};
  auto store = make_store(make_layout(layers, 0, {128, 3, 8}), {GGML_TYPE_F16, GGML_TYPE_F16});
  const SeqId s = *store->create_sequence();
  std::mt19937_64 rng(11);
  for (int i = 0; i < 4; ++i) run_step(*store, s, 3, random_inputs(rng, store->layout(), 3, 4));
  auto snap = store->snapshot(s);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ((*snap)->length(), 12);
  const SeqId twin = *store->fork(s, 12); // never moves
  for (int i = 0; i < 10; ++i) run_step(*store, s, 1, random_inputs(rng, store->layout(), 1, 4));
  ASSERT_FALSE(store->rewind(s, 12).ok()); // the rings wrapped past the boundary
  ASSERT_TRUE(store->restore(s, **snap).ok());
  for (int i = 0; i < 6; ++i) {
    auto in = random_inputs(rng, store->layout(), i % 2 ? 1 : 3, 4);
    const int32_t n = i % 2 ? 1 : 3;
    ASSERT_EQ(run_step(*store, s, n, in), run_step(*store, twin, n, in)) << "step " << i;
  }
}

TEST(KvStore, RejectsTypesAttentionCannotRead) {
  const std::vector<cache::LayerSpec> layers = {layer(0, 2, 48, 64)};
  auto layout = make_layout(layers, 0, {64, 4, 8});
  auto q8 =
      KvStore::create(layout, {GGML_TYPE_Q8_0, GGML_TYPE_F16}, ggml_backend_cpu_buffer_type());
  ASSERT_FALSE(q8.ok()); // 48 is not a multiple of q8_0's 32-value blocks
  EXPECT_NE(q8.message().find("head dim 48"), std::string::npos) << q8.message();
  auto kq =
      KvStore::create(layout, {GGML_TYPE_F16, GGML_TYPE_Q4_K}, ggml_backend_cpu_buffer_type());
  ASSERT_FALSE(kq.ok());
  EXPECT_NE(kq.message().find("q4_K"), std::string::npos) << kq.message();
  EXPECT_TRUE(parse_storage_type("q8_0").ok());
  auto bad = parse_storage_type("q3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("accepted"), std::string::npos);
}

TEST(KvStore, StepRefusesShapeMismatchesAndUnknownSequences) {
  const std::vector<cache::LayerSpec> layers = {layer(0)};
  auto store = make_store(make_layout(layers, 0, {64, 4, 8}), {GGML_TYPE_F16, GGML_TYPE_F16});
  const SeqId s = *store->create_sequence();
  Step step(*store);
  EXPECT_FALSE(step.add_span({s + 1, 0, 1}).ok());
  EXPECT_FALSE(step.add_span({s, 3, 1}).ok()); // does not continue the sequence
  auto span = step.add_span({s, 0, 2});
  ASSERT_TRUE(span.ok());
  EXPECT_FALSE(step.add_span({s, 0, 1}).ok()); // one span per sequence per step
  ggml_init_params params = {16 * ggml_tensor_overhead(), nullptr, true};
  ggml_context_ptr ctx(ggml_init(params));
  ggml_tensor *q =
      ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, 64, 3, 2); // 3 is not a multiple of 2
  ggml_tensor *k = ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, 64, 2, 2);
  ggml_tensor *v = ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, 32, 2, 2);
  auto out = step.update_and_attend(ctx.get(), q, k, v, *span, 0, 0.125f);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("expects q"), std::string::npos) << out.message();
}

TEST(KvStore, SnapshotsAreAccountedAndBudgeted) {
  const std::vector<cache::LayerSpec> layers = {layer(8), layer(0)};
  auto store = make_store(make_layout(layers, 0, {256, 4, 16}), {GGML_TYPE_F16, GGML_TYPE_F16});
  const SeqId s = *store->create_sequence();
  std::mt19937_64 rng(13);
  for (int i = 0; i < 5; ++i) run_step(*store, s, 4, random_inputs(rng, store->layout(), 4, 2));
  const int64_t row = 2 * 64 * 2 + 2 * 32 * 2; // f16 K (2 heads x 64) and V (2 heads x 32)
  EXPECT_EQ(store->memory().snapshots, 0);
  auto a = store->snapshot(s);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->spec().total_rows(), 7); // window - 1 rows of the one ring
  EXPECT_GE(store->memory().snapshots, 7 * row);
  const int64_t one = store->memory().snapshots;
  {
    auto b = store->snapshot(s);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(store->memory().snapshots, 2 * one);
  }
  EXPECT_EQ(store->memory().snapshots, one); // dropping a snapshot returns its bytes
  store->set_memory_budget(store->memory().buffers + store->memory().snapshots + one / 2);
  auto refused = store->snapshot(s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("memory budget"), std::string::npos) << refused.message();
}

// The ledger's per-device figures (bytes_in_use_by_buffer_type) against hand arithmetic: pages in
// use, one ring per sequence and live snapshots, each counted once, through growth, a second
// sequence, snapshots taken and dropped; they add up to bytes_in_use().
TEST(KvStore, BytesByBufferTypeAreWhatIsInUse) {
  const std::vector<cache::LayerSpec> layers = {layer(8), layer(0)};
  auto store = make_store(make_layout(layers, 0, {256, 4, 16}), {GGML_TYPE_F16, GGML_TYPE_F16});
  const int64_t row = 2 * 64 * 2 + 2 * 32 * 2; // f16 K (2 heads x 64) and V (2 heads x 32)
  const int64_t ring = store->memory(*store->create_sequence()).ring;
  ASSERT_GT(ring, 0);
  ASSERT_TRUE(store->remove_sequence(0).ok());
  auto by = [&] {
    const BytesByBufferType b = store->bytes_in_use_by_buffer_type();
    EXPECT_LE(b.size(), 1u);
    if (b.empty()) return int64_t(0);
    EXPECT_EQ(b[0].first, ggml_backend_cpu_buffer_type());
    return b[0].second;
  };
  EXPECT_EQ(by(), 0);
  const SeqId s = *store->create_sequence();
  std::mt19937_64 rng(17);
  for (int i = 0; i < 5; ++i) run_step(*store, s, 4, random_inputs(rng, store->layout(), 4, 2));
  const int64_t pages = 2 * 16 * row; // 20 positions in pages of 16 rows
  EXPECT_EQ(by(), ring + pages);
  const SeqId t = *store->create_sequence();
  run_step(*store, t, 3, random_inputs(rng, store->layout(), 3, 2));
  EXPECT_EQ(by(), 2 * ring + pages + 16 * row);
  {
    auto a = store->snapshot(s);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(by(), 2 * ring + pages + 16 * row + (*a)->bytes());
    EXPECT_EQ(by(), store->bytes_in_use());
  }
  EXPECT_EQ(by(), 2 * ring + pages + 16 * row); // the dropped snapshot's bytes went
  EXPECT_EQ(by(), store->bytes_in_use());
}

TEST(KvStore, OneStepAtATime) {
  const std::vector<cache::LayerSpec> layers = {layer(0)};
  auto store = make_store(make_layout(layers, 0, {64, 4, 8}), {GGML_TYPE_F16, GGML_TYPE_F16});
  const SeqId a = *store->create_sequence(), b = *store->create_sequence();
  Step first(*store);
  ASSERT_TRUE(first.add_span({a, 0, 1}).ok());
  Step second(*store);
  auto refused = second.add_span({b, 0, 1});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("in flight"), std::string::npos) << refused.message();
}

TEST(KvStore, LogicalRingOrderNeedsConcatenableTypes) {
  const std::vector<cache::LayerSpec> layers = {layer(4)};
  auto q8 = make_store(make_layout(layers, 0, {64, 4, 8}), {GGML_TYPE_Q8_0, GGML_TYPE_F16});
  EXPECT_FALSE(q8->set_ring_order(RingOrder::Logical).ok());
  auto f16 = make_store(make_layout(layers, 0, {64, 4, 8}), {GGML_TYPE_F16, GGML_TYPE_F16});
  EXPECT_TRUE(f16->set_ring_order(RingOrder::Logical).ok());
}

} // namespace
} // namespace offgraph::kv
