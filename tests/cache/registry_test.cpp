#include "cache/registry.h"
#include "cache/sequence.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace offgraph::cache {
namespace {

TEST(Registry, InstallerMintsUniqueKeysAndLookupFindsTheSameObject) {
  Registry<Sequence> registry("test-caches");
  auto layout = testing::make_layout({4, 0}, 64, 4);
  auto a = std::make_shared<Sequence>(layout);
  auto b = std::make_shared<Sequence>(layout);
  auto ga = registry.install(a);
  auto gb = registry.install(b);
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_NE(ga->key(), gb->key());
  auto found = registry.lookup(ga->key());
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->get(), a.get());
  EXPECT_EQ(registry.size(), 2u);
}

TEST(Registry, MissingKeyIsAClearError) {
  Registry<Sequence> registry("test-caches");
  auto r = registry.lookup("nope");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("'nope'"), std::string::npos) << r.message();
  EXPECT_FALSE(registry.install(nullptr).ok());
}

TEST(Registry, DroppingTheGuardUnpublishesButHoldersKeepTheCache) {
  Registry<Sequence> registry("test-caches");
  auto seq = std::make_shared<Sequence>(testing::make_layout({0}, 16, 4));
  std::shared_ptr<Sequence> held;
  std::string key;
  {
    auto guard = registry.install(seq);
    ASSERT_TRUE(guard.ok());
    key = guard->key();
    held = *registry.lookup(key);
  }
  EXPECT_FALSE(registry.lookup(key).ok());
  EXPECT_EQ(registry.size(), 0u);
  seq.reset();
  ASSERT_TRUE(held);
  EXPECT_EQ(held->capacity(), 16);
}

TEST(Registry, ConcurrentInstallsGetDistinctKeys) {
  Registry<int> registry("ints");
  std::vector<std::string> keys[4];
  std::vector<Registry<int>::InstallGuard> guards[4];
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto g = registry.install(std::make_shared<int>(i));
        keys[t].push_back(g->key());
        guards[t].push_back(std::move(g).value());
      }
    });
  for (auto &th : threads) th.join();
  std::set<std::string> all;
  for (auto &k : keys) all.insert(k.begin(), k.end());
  EXPECT_EQ(all.size(), 800u);
  EXPECT_EQ(registry.size(), 800u);
}

} // namespace
} // namespace offgraph::cache
