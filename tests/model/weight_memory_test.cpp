// Where a model's weights live (model/weight_memory.h): the choice's rules, one by one, and the
// two kinds of memory holding a file's exact bytes.
#include "model/weight_memory.h"

#include "model_test_util.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

namespace offgraph::model {
namespace {

constexpr uint64_t kGiB = uint64_t(1) << 30;

// A file of `bytes`, all of them q8_0.
WeightBytes q8(uint64_t bytes) { return {bytes, bytes}; }

TEST(WeightStorageChoice, AnonymousHugePagesOnlyWhereEveryRuleAllows) {
  const auto a = WeightStorage::automatic;
  // The default case: huge pages offered, everything on the CPU, well inside half.
  EXPECT_TRUE(choose_weight_storage(q8(1 * kGiB), 8 * kGiB, "madvise", true, a).anonymous);
  EXPECT_TRUE(choose_weight_storage(q8(1 * kGiB), 8 * kGiB, "always", true, a).anonymous);
  // Each rule alone turns it off, and says why.
  auto never = choose_weight_storage(q8(1 * kGiB), 8 * kGiB, "never", true, a);
  EXPECT_FALSE(never.anonymous);
  EXPECT_NE(never.why.find("huge pages"), std::string::npos) << never.why;
  EXPECT_FALSE(choose_weight_storage(q8(1 * kGiB), 8 * kGiB, "", true, a).anonymous);
  auto devices = choose_weight_storage(q8(1 * kGiB), 8 * kGiB, "madvise", false, a);
  EXPECT_FALSE(devices.anonymous);
  EXPECT_NE(devices.why.find("devices"), std::string::npos) << devices.why;
  // Half of what is available: 5 GiB against 10 fits, a byte more does not.
  EXPECT_TRUE(choose_weight_storage(q8(5 * kGiB), 10 * kGiB, "madvise", true, a).anonymous);
  auto crowded = choose_weight_storage(q8(5 * kGiB + 1), 10 * kGiB, "madvise", true, a);
  EXPECT_FALSE(crowded.anonymous);
  EXPECT_NE(crowded.why.find("available"), std::string::npos) << crowded.why;
  auto unknown = choose_weight_storage(q8(1), 0, "madvise", true, a);
  EXPECT_FALSE(unknown.anonymous);
  EXPECT_NE(unknown.why.find("unknown"), std::string::npos) << unknown.why;
  // Where q8_0 holds less than half of the bytes (f16, k-quants): the mapping, saying why; half
  // is enough.
  auto f16 = choose_weight_storage({1 * kGiB, 0}, 8 * kGiB, "madvise", true, a);
  EXPECT_FALSE(f16.anonymous);
  EXPECT_NE(f16.why.find("q8_0"), std::string::npos) << f16.why;
  EXPECT_FALSE(
      choose_weight_storage({1 * kGiB, kGiB / 2 - 1}, 8 * kGiB, "madvise", true, a).anonymous);
  EXPECT_TRUE(choose_weight_storage({1 * kGiB, kGiB / 2}, 8 * kGiB, "madvise", true, a).anonymous);
  // A request wins over the rules.
  EXPECT_FALSE(choose_weight_storage(q8(1 * kGiB), 8 * kGiB, "madvise", true, WeightStorage::mapped)
                   .anonymous);
  EXPECT_TRUE(
      choose_weight_storage({1 * kGiB, 0}, 8 * kGiB, "never", false, WeightStorage::anonymous)
          .anonymous);
}

// Both kinds hold the file's bytes exactly (a size not a multiple of any page, random content);
// the anonymous one starts on a 2 MiB boundary and reports progress up to the whole size.
TEST(WeightMemoryLoad, BothKindsHoldTheFilesExactBytes) {
  const std::string path = (testing::temp_dir() / "weight-memory.bin").string();
  std::vector<char> bytes((uint64_t(3) << 20) + 12345);
  std::mt19937_64 rng(5);
  for (char &c : bytes) c = char(rng());
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  for (bool anonymous : {false, true}) {
    SCOPED_TRACE(anonymous ? "anonymous" : "mapped");
    uint64_t last = 0;
    auto w = WeightMemory::load(path, bytes.size(), anonymous,
                                [&](uint64_t done, uint64_t) { last = done; });
    ASSERT_TRUE(w.ok()) << w.message();
    EXPECT_EQ(w->anonymous(), anonymous);
    ASSERT_EQ(w->size(), bytes.size());
    EXPECT_EQ(std::memcmp(w->data(), bytes.data(), bytes.size()), 0);
    if (anonymous) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data()) % (uintptr_t(2) << 20), 0u);
      EXPECT_EQ(last, bytes.size());
    }
  }
  // A file shorter than asked: an error naming the bytes, not a short copy.
  auto shorter = WeightMemory::load(path, bytes.size() + 100, true, nullptr);
  ASSERT_FALSE(shorter.ok());
  EXPECT_NE(shorter.message().find("ended early"), std::string::npos) << shorter.message();
  auto empty = WeightMemory::load(path, 0, true, nullptr);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.message().find("no bytes"), std::string::npos) << empty.message();
  auto missing = WeightMemory::load(path + ".absent", 10, true, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("cannot open"), std::string::npos) << missing.message();
}

// The anonymous copy is read-only, as the mapping is: a stray write faults instead of changing a
// weight.
TEST(WeightMemoryLoadDeathTest, TheAnonymousCopyIsReadOnly) {
  const std::string path = (testing::temp_dir() / "weight-memory-ro.bin").string();
  std::vector<char> bytes(4096, 7);
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  auto w = WeightMemory::load(path, bytes.size(), true, nullptr);
  ASSERT_TRUE(w.ok()) << w.message();
  EXPECT_DEATH(static_cast<volatile char *>(w->data())[10] = 1, "");
}

} // namespace
} // namespace offgraph::model
