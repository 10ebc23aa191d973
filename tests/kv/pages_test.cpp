// Paged flat storage: forks share pages, writes into shared pages copy them first, rewinds give
// pages back, a shared prefix is held and counted once, and an exhausted pool is a clear refusal.
// Outputs are checked against sequences built alone, in a store of their own, from the same
// inputs (bit for bit: the kernels read the same rows in the same order).
#include "store_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>

namespace offgraph::kv {
namespace {

using testing::layer;
using testing::LayerInputs;
using testing::make_layout;
using testing::make_store;
using testing::random_inputs;
using testing::run_step;
using Outputs = std::vector<std::vector<float>>;

// A full-attention cache, a sliding one (a ring) and another full one; pages of 4 rows.
std::vector<cache::LayerSpec> three_layers() { return {layer(0), layer(5), layer(0, 1, 32, 64)}; }

// q_heads 4: groups of 2 and 4; 16: groups of 8 and 16 (offgraph's grouped kernel through the page
// table; ggml's masked range is EveryKernelReadsScatteredPagesAsContiguousRows's).
void forks_share_pages(int32_t q_heads) {
  SCOPED_TRACE("query heads " + std::to_string(q_heads));
  auto store =
      make_store(make_layout(three_layers(), 0, {128, 4, 4}), {GGML_TYPE_F16, GGML_TYPE_F16});
  auto alone =
      make_store(make_layout(three_layers(), 0, {128, 4, 128}), {GGML_TYPE_F16, GGML_TYPE_F16});
  std::mt19937_64 rng(21);
  std::vector<std::vector<LayerInputs>> prefix;
  const SeqId a = *store->create_sequence();
  for (int32_t n : {4, 2, 2, 2}) { // length 10: pages 0, 1 full, page 2 half
    prefix.push_back(random_inputs(rng, store->layout(), n, q_heads));
    run_step(*store, a, n, prefix.back());
  }
  ASSERT_EQ(store->memory().pages, 3);
  const SeqId b = *store->fork(a, 10), c = *store->fork(a, 6); // c shares pages 0 and 1
  EXPECT_EQ(store->memory().pages, 3);
  EXPECT_EQ(store->memory().shared_pages, 3);
  EXPECT_EQ(store->memory(b).pages, 3);
  EXPECT_EQ(store->memory(c).pages, 2);
  EXPECT_EQ(store->memory().flat, 3 * store->page_bytes()); // shared pages counted once
  // Each writes its own continuation; the shared half page is copied by the first two writers and
  // then owned by the third; c's write lands in page 1, shared with a and b.
  std::vector<std::vector<LayerInputs>> next_a, next_b, next_c;
  Outputs out_a, out_b, out_c;
  for (int i = 0; i < 3; ++i) {
    next_b.push_back(random_inputs(rng, store->layout(), 1, q_heads));
    out_b.push_back(run_step(*store, b, 1, next_b.back())[0]);
    next_c.push_back(random_inputs(rng, store->layout(), 3, q_heads));
    out_c.push_back(run_step(*store, c, 3, next_c.back())[0]);
    next_a.push_back(random_inputs(rng, store->layout(), 2, q_heads));
    out_a.push_back(run_step(*store, a, 2, next_a.back())[0]);
  }
  EXPECT_EQ(store->sequence(a)->length(), 16);
  EXPECT_EQ(store->sequence(b)->length(), 13);
  EXPECT_EQ(store->sequence(c)->length(), 15);
  // a: pages 0, 1 shared, its own page 2 and a new page 3; b: 0, 1, a copy of 2, a new 3; c: 0, a
  // copy of 1, new 2 and 3.
  EXPECT_EQ(store->memory().pages, 2 + 2 + 2 + 3);
  EXPECT_EQ(store->memory().shared_pages, 1 + 1); // page 0 (all three), page 1 (a and b)
  // Every output equals that of the same history computed alone.
  auto with = [](std::vector<std::vector<LayerInputs>> h,
                 const std::vector<std::vector<LayerInputs>> &more, size_t keep_steps) {
    h.resize(keep_steps);
    h.insert(h.end(), more.begin(), more.end());
    return h;
  };
  struct Case {
    std::vector<std::vector<LayerInputs>> history;
    const Outputs *outs;
    size_t steps_before;
  } cases[] = {{with(prefix, next_a, 4), &out_a, 4},
               {with(prefix, next_b, 4), &out_b, 4},
               {with(prefix, next_c, 2), &out_c, 2}}; // c: the first 6 tokens
  for (const Case &k : cases) {
    const SeqId s = *alone->create_sequence();
    for (size_t i = 0; i < k.history.size(); ++i) {
      const int32_t n = int32_t(k.history[i][0].k.size() / (2 * 64));
      auto out = run_step(*alone, s, n, k.history[i]);
      if (i >= k.steps_before) {
        EXPECT_EQ(out[0], (*k.outs)[i - k.steps_before]) << "step " << i;
      }
    }
    ASSERT_TRUE(alone->remove_sequence(s).ok());
  }
}

TEST(Pages, ForksShareEveryPageAndWritesCopyOnlyTheSharedOne) {
  for (int32_t q_heads : {4, 16}) forks_share_pages(q_heads);
}

TEST(Pages, EveryKernelReadsScatteredPagesAsContiguousRows) {
  // Two sequences interleaved page by page in one store, against one page per sequence, bit for
  // bit: prefill chunks (tiled kernel) and decode (grouped kernel) on groups of 4 and 2; with
  // ggml's kernel everywhere, scattered pages are read as a masked range of pool rows.
  const std::vector<cache::LayerSpec> layers = {layer(0), layer(0, 4, 64, 64)};
  for (AttentionKernel kernel : {AttentionKernel::Grouped, AttentionKernel::Ggml}) {
    SCOPED_TRACE(kernel == AttentionKernel::Grouped ? "offgraph's kernels" : "ggml's kernel");
    auto paged = make_store(make_layout(layers, 0, {512, 40, 4}), {GGML_TYPE_F16, GGML_TYPE_F16});
    auto whole = make_store(make_layout(layers, 0, {512, 40, 512}), {GGML_TYPE_F16, GGML_TYPE_F16});
    paged->set_attention_kernel(kernel);
    whole->set_attention_kernel(kernel);
    const SeqId a = *paged->create_sequence(), other = *paged->create_sequence();
    const SeqId b = *whole->create_sequence();
    std::mt19937_64 rng(25);
    std::set<std::string> seen;
    for (int32_t n : {37, 1, 40, 2, 1, 19, 1}) {
      auto in = random_inputs(rng, paged->layout(), n, 8); // groups of 4 and of 2
      std::vector<std::string> kernels;
      auto out = run_step(*paged, a, n, in, &kernels);
      ASSERT_EQ(out, run_step(*whole, b, n, in)) << "at length " << paged->sequence(a)->length();
      seen.insert(kernels.begin(), kernels.end());
      run_step(*paged, other, n, random_inputs(rng, paged->layout(), n, 8));
    }
    if (kernel == AttentionKernel::Grouped) {
      EXPECT_TRUE(seen.count("tiled_attention"));
      EXPECT_TRUE(seen.count("grouped_attention"));
    } else {
      EXPECT_EQ(seen, std::set<std::string>{"flash_attn_ext"});
    }
    const std::vector<cache::PageId> &pages = paged->page_table(a)->pages;
    EXPECT_FALSE(std::adjacent_find(pages.begin(), pages.end(),
                                    [](cache::PageId x, cache::PageId y) { return y != x + 1; }) ==
                 pages.end()); // scattered
  }
}

TEST(Pages, AForkAtASnapshotEqualsNeverHavingMoved) {
  // The prefix tree's resume: a snapshot taken at 12, the sequence moved on past its rings; a new
  // sequence from its pages and the snapshot decodes as a fork taken at 12 does.
  const std::vector<cache::LayerSpec> layers = {layer(4), layer(0), layer(3)};
  auto store = make_store(make_layout(layers, 0, {128, 3, 4}), {GGML_TYPE_F16, GGML_TYPE_F16});
  const SeqId s = *store->create_sequence();
  std::mt19937_64 rng(26);
  for (int i = 0; i < 4; ++i) run_step(*store, s, 3, random_inputs(rng, store->layout(), 3, 8));
  auto snap = store->snapshot(s);
  ASSERT_TRUE(snap.ok());
  const SeqId twin = *store->fork(s, 12);
  for (int i = 0; i < 10; ++i) run_step(*store, s, 1, random_inputs(rng, store->layout(), 1, 8));
  ASSERT_FALSE(store->fork(s, 12).ok()); // the rings moved on
  auto resumed = store->fork_at_snapshot(s, **snap);
  ASSERT_TRUE(resumed.ok()) << resumed.message();
  EXPECT_EQ(store->sequence(*resumed)->length(), 12);
  EXPECT_EQ(store->memory(*resumed).pages, 3); // shared with s and the twin
  for (int i = 0; i < 6; ++i) {
    const int32_t n = i % 2 ? 1 : 3;
    auto in = random_inputs(rng, store->layout(), n, 8);
    ASSERT_EQ(run_step(*store, *resumed, n, in), run_step(*store, twin, n, in)) << "step " << i;
  }
  // Pages for the snapshot's positions are needed.
  const SeqId short_one = *store->create_sequence();
  run_step(*store, short_one, 3, random_inputs(rng, store->layout(), 3, 8));
  run_step(*store, short_one, 1, random_inputs(rng, store->layout(), 1, 8));
  auto refused = store->fork_at_snapshot(short_one, **snap);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("holds 4"), std::string::npos) << refused.message();
}

TEST(Pages, RewindGivesBackPagesPastTheLengthAndKeepsSharedOnes) {
  auto store = make_store(make_layout({layer(0)}, 0, {256, 8, 4}), {GGML_TYPE_F16, GGML_TYPE_F16});
  std::mt19937_64 rng(22);
  const SeqId a = *store->create_sequence();
  for (int i = 0; i < 5; ++i) run_step(*store, a, 4, random_inputs(rng, store->layout(), 4, 2));
  ASSERT_EQ(store->memory().pages, 5);
  const SeqId b = *store->fork(a, 20);
  ASSERT_TRUE(store->rewind(a, 9).ok()); // keeps pages 0-2
  EXPECT_EQ(store->memory(a).pages, 3);
  EXPECT_EQ(store->memory().pages, 5); // b still holds pages 3 and 4
  EXPECT_EQ(store->memory().shared_pages, 3);
  ASSERT_TRUE(store->remove_sequence(b).ok());
  EXPECT_EQ(store->memory().pages, 3);
  EXPECT_EQ(store->memory().shared_pages, 0);
  ASSERT_TRUE(store->rewind(a, 0).ok());
  EXPECT_EQ(store->memory().pages, 0);
  EXPECT_FALSE(store->rewind(a, 1).ok()); // the core's refusals stand
}

// Free pages give their memory back to the OS, all but the most recently freed ones asked to be
// kept; the pool's resident bytes (mincore) drop by exactly that, and sequences on the pages
// afterwards compute what they compute in a fresh store, bit for bit.
TEST(Pages, FreePagesGiveTheirMemoryBackAndServeAgainAsFreshOnes) {
  // Pages of 64 rows of 512 bytes in each of four tensors (two caches, K and V): whole OS pages.
  const std::vector<cache::LayerSpec> layers = {layer(0, 2, 64, 64), layer(0, 2, 64, 64)};
  auto store = make_store(make_layout(layers, 0, {1024, 64, 64}), {GGML_TYPE_F32, GGML_TYPE_F32});
  auto fresh = make_store(make_layout(layers, 0, {1024, 64, 64}), {GGML_TYPE_F32, GGML_TYPE_F32});
  const int64_t page = store->page_bytes();
  ASSERT_EQ(page, 64 * 512 * 4);
  std::mt19937_64 rng(37);
  const SeqId a = *store->create_sequence(), b = *store->create_sequence();
  for (int i = 0; i < 8; ++i) {
    run_step(*store, a, 64, random_inputs(rng, store->layout(), 64, 4));
    run_step(*store, b, 64, random_inputs(rng, store->layout(), 64, 4));
  }
  ASSERT_EQ(store->memory().pages, 16);
  const int64_t resident = store->resident_pool_bytes();
  EXPECT_GE(resident, 16 * page);
  EXPECT_EQ(store->release_free_memory(0), 0); // nothing is free yet
  ASSERT_TRUE(store->remove_sequence(a).ok());
  ASSERT_TRUE(store->remove_sequence(b).ok());
  EXPECT_EQ(store->resident_pool_bytes(), resident); // freed, still held
  // Keep three pages' worth (and a bit: whole pages only): 13 go back.
  EXPECT_EQ(store->release_free_memory(3 * page + page / 2), 13 * page);
  EXPECT_EQ(store->resident_pool_bytes(), resident - 13 * page);
  EXPECT_EQ(store->pages().free_warm(), 3);
  EXPECT_EQ(store->release_free_memory(3 * page), 0); // already given
  // Ten pages again: the three warm ones first, then seven given back (zeros now).
  const SeqId c = *store->create_sequence(), d = *fresh->create_sequence();
  for (int i = 0; i < 10; ++i) {
    const int32_t n = i % 3 ? 64 : 37;
    auto in = random_inputs(rng, store->layout(), n, 4);
    ASSERT_EQ(run_step(*store, c, n, in), run_step(*fresh, d, n, in)) << "step " << i;
  }
  EXPECT_EQ(store->pages().free_warm(), 0);
}

TEST(Pages, AStoreHoldsASharedPrefixOnceAndWithinAPageASequenceOfTheMinimum) {
  const std::vector<cache::LayerSpec> layers = {layer(0), layer(3)};
  auto store = make_store(make_layout(layers, 0, {512, 4, 8}), {GGML_TYPE_F16, GGML_TYPE_F16});
  std::mt19937_64 rng(23);
  const SeqId root = *store->create_sequence();
  while (store->sequence(root)->length() < 37)
    run_step(*store, root, 1, random_inputs(rng, store->layout(), 1, 2));
  std::vector<SeqId> children;
  for (int i = 0; i < 4; ++i) children.push_back(*store->fork(root, 37));
  const int64_t flat_row = 2 * 64 * 2 + 2 * 32 * 2;
  const int64_t ring_seq = int64_t(3 + 4 - 1) * flat_row; // the ring: window + max_write - 1
  const int64_t ring_min = 3 * flat_row;                  // the window
  const MemoryUse shared = store->memory();
  EXPECT_EQ(shared.pages, 5);
  EXPECT_EQ(shared.minimum, 37 * flat_row + 5 * ring_min);
  for (SeqId c : children) run_step(*store, c, 1, random_inputs(rng, store->layout(), 1, 2));
  // Pages 0-3 shared by all; page 4: the root's, and a copy per child with its 6 rows.
  const MemoryUse m = store->memory();
  EXPECT_EQ(m.pages, 4 + 1 + 4);
  EXPECT_EQ(m.shared_pages, 4);
  EXPECT_EQ(m.minimum, (32 + 5 + 4 * 6) * flat_row + 5 * ring_min);
  // Held: at most one page of slack and the ring's reach per sequence beyond the minimum.
  EXPECT_LE(m.held, m.minimum + 5 * (store->page_bytes() + ring_seq - ring_min));
  EXPECT_EQ(m.held, m.pages * store->page_bytes() + 5 * ring_seq);
}

TEST(Pages, AnExhaustedPoolIsAClearRefusalAndSharingStillWorks) {
  auto store = make_store(make_layout({layer(0)}, 0, {256, 4, 4}), {GGML_TYPE_F16, GGML_TYPE_F16});
  auto small = KvStore::create(store->shared_layout(), {GGML_TYPE_F16, GGML_TYPE_F16},
                               ggml_backend_cpu_buffer_type(), 2);
  ASSERT_TRUE(small.ok()) << small.message();
  KvStore &kv = **small;
  EXPECT_EQ(kv.pages().max_pages(), 2);
  std::mt19937_64 rng(24);
  const SeqId a = *kv.create_sequence();
  for (int i = 0; i < 2; ++i) run_step(kv, a, 3, random_inputs(rng, kv.layout(), 3, 2)); // 6 rows
  const SeqId b = *kv.fork(a, 6); // shares both pages: no new one needed
  EXPECT_EQ(kv.memory().pages, 2);
  Step step(kv);
  auto refused = step.add_span({b, 6, 1}); // page 1 is shared: copying it needs a third page
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("page pool is exhausted"), std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("2 of 2 pages"), std::string::npos) << refused.message();
  EXPECT_EQ(kv.memory(b).pages, 2); // unchanged
  EXPECT_EQ(kv.sequence(b)->length(), 6);
}

} // namespace
} // namespace offgraph::kv
