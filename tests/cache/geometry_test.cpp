#include "cache/geometry.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace offgraph::cache {
namespace {

using testing::layer;

TEST(Geometry, MuseGlimmerHas52CachesWithEveryFourthLayerFull) {
  std::vector<LayerSpec> layers;
  for (int i = 0; i < 52; ++i) layers.push_back(layer(i % 4 == 3 ? 0 : 2048, 2, 128, 128));
  auto g = Geometry::build(layers, 0);
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_EQ(g->n_layers(), 52);
  EXPECT_EQ(g->n_caches(), 52);
  int rings = 0;
  for (int i = 0; i < 52; ++i) {
    EXPECT_EQ(g->cache_of_layer(i), i);
    EXPECT_FALSE(g->is_shared_layer(i));
    rings += g->cache(i).attention.sliding();
  }
  EXPECT_EQ(rings, 39);
  EXPECT_EQ(g->cache(3).attention.window, 0);
  EXPECT_EQ(g->cache(0).k_elements_per_token(), 256);
}

// gemma-4-E2B shape: 35 layers, every fifth full, the last 20 share; donors are 13 (sliding) and
// 14 (full), the last layer of each kind before the shared block.
TEST(Geometry, SharedLayersReadTheLastSameKindLayerBeforeTheSharedBlock) {
  std::vector<LayerSpec> layers;
  for (int i = 0; i < 35; ++i) layers.push_back(layer(i % 5 == 4 ? 0 : 512));
  auto g = Geometry::build(layers, 20);
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_EQ(g->n_caches(), 15);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(g->cache(g->cache_of_layer(i)).owner_layer, i);
  for (int i = 15; i < 35; ++i) {
    EXPECT_TRUE(g->is_shared_layer(i)) << i;
    EXPECT_EQ(g->cache(g->cache_of_layer(i)).owner_layer, i % 5 == 4 ? 14 : 13) << i;
  }
}

TEST(Geometry, ZeroSharedLayersMeansNoSharing) {
  std::vector<LayerSpec> layers = {layer(4), layer(0), layer(4)};
  auto g = Geometry::build(layers, 0);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->n_caches(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(g->is_shared_layer(i));
}

TEST(Geometry, DonorKindIncludesTheWindowSize) {
  // Layer 3 is sliding with window 8; only layer 0 has that window, layer 2's window is 4.
  std::vector<LayerSpec> layers = {layer(8), layer(0), layer(4), layer(8)};
  auto g = Geometry::build(layers, 1);
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_EQ(g->cache(g->cache_of_layer(3)).owner_layer, 0);
}

TEST(Geometry, SharedLayerWithoutDonorIsAnError) {
  std::vector<LayerSpec> layers = {layer(4), layer(4), layer(0)};
  auto g = Geometry::build(layers, 1);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.message().find("layer 2"), std::string::npos) << g.message();
  EXPECT_NE(g.message().find("full attention"), std::string::npos) << g.message();
}

TEST(Geometry, SharedLayerWithOtherHeadShapeIsAnError) {
  std::vector<LayerSpec> layers = {layer(0, 2, 8, 8), layer(0, 4, 8, 8)};
  auto g = Geometry::build(layers, 1);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.message().find("donor"), std::string::npos) << g.message();
}

TEST(Geometry, RejectsInvalidDescriptions) {
  std::vector<LayerSpec> none;
  EXPECT_FALSE(Geometry::build(none, 0).ok());
  std::vector<LayerSpec> two = {layer(0), layer(0)};
  EXPECT_FALSE(Geometry::build(two, -1).ok());
  EXPECT_FALSE(Geometry::build(two, 2).ok()); // nobody left to own a cache
  for (LayerSpec bad : {layer(-1), layer(0, 0), layer(0, 2, 0), layer(0, 2, 8, 0), layer(0, -3)}) {
    std::vector<LayerSpec> one = {bad};
    auto g = Geometry::build(one, 0);
    EXPECT_FALSE(g.ok());
    EXPECT_NE(g.message().find("layer 0"), std::string::npos) << g.message();
  }
}

TEST(Geometry, KAndVHeadDimsMayDiffer) {
  std::vector<LayerSpec> layers = {layer(0, 1, 192, 128)};
  auto g = Geometry::build(layers, 0);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->cache(0).k_elements_per_token(), 192);
  EXPECT_EQ(g->cache(0).v_elements_per_token(), 128);
}

} // namespace
} // namespace offgraph::cache
