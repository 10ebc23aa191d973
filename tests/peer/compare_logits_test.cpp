// compare_logits (tools/peer) on files written here: equal files pass; a row over the bound fails;
// greedy picks that part fail, unless --near-ties is given, the split comes after 8 identical
// picks and the row that made it is within the bound with its two candidates closer than the rows
// differ.
#include "peer/logits_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace offgraph::peer {
namespace {

constexpr uint32_t kVocab = 16, kPrompt = 4, kPicks = 16;

// Rows of clear winners (the picked token leads by 3), the greedy picks following them.
LogitsFile clear_winners(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  LogitsFile f;
  f.n_vocab = kVocab;
  f.n_prompt = kPrompt;
  for (uint32_t i = 0; i < kPrompt; ++i) f.tokens.push_back(uint32_t(rng() % kVocab));
  const uint32_t rows = kPrompt + kPicks - 1;
  for (uint32_t r = 0; r < rows; ++r) {
    const uint32_t pick = uint32_t(rng() % kVocab);
    for (uint32_t v = 0; v < kVocab; ++v) f.logits.push_back(v == pick ? 6.0f : normal(rng));
    if (r + 1 >= kPrompt) f.tokens.push_back(pick);
  }
  return f;
}

// `f` with row `r` made a near tie between its pick and token `other` (gap `gap`), the other
// side of it chosen by `ours`: ours picks `other` there and follows it with other tokens.
void tie_at(LogitsFile &f, uint32_t r, uint32_t other, float gap, bool ours) {
  const uint32_t picked = f.tokens[r + 1];
  float *row = f.logits.data() + size_t(r) * kVocab;
  row[other] = row[picked] - gap;
  if (!ours) return;
  row[other] = row[picked] + gap; // a difference of 2 gap in one logit of the row
  f.tokens[r + 1] = other;
  for (size_t i = r + 2; i < f.tokens.size(); ++i) f.tokens[i] = (f.tokens[i] + 1) % kVocab;
}

int compare(const LogitsFile &ours, const LogitsFile &theirs, const std::string &extra = "") {
  // ctest runs each test in its own process, several at once: the files are named by the test
  // and the process, or one test's files are overwritten by another's mid-comparison.
  const auto dir = std::filesystem::temp_directory_path();
  const std::string stem = std::string("compare_logits_test.") +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "." +
                           std::to_string(::getpid());
  const std::string a = (dir / (stem + ".ours")).string();
  const std::string b = (dir / (stem + ".theirs")).string();
  EXPECT_TRUE(ours.write(a));
  EXPECT_TRUE(theirs.write(b));
  const std::string cmd = std::string(OFFGRAPH_COMPARE_LOGITS) + " " + a + " " + b + " 1e-2 " +
                          extra + " > /dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  std::filesystem::remove(a);
  std::filesystem::remove(b);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(CompareLogits, EqualFilesPass) {
  const LogitsFile f = clear_winners(1);
  EXPECT_EQ(compare(f, f), 0);
  EXPECT_EQ(compare(f, f, "--near-ties"), 0);
}

TEST(CompareLogits, ARowOverTheBoundFails) {
  const LogitsFile theirs = clear_winners(2);
  LogitsFile ours = theirs;
  ours.logits[size_t(5) * kVocab + 3] += 1.0f; // about 0.15 of the row's norm
  EXPECT_EQ(compare(ours, theirs), 1);
  EXPECT_EQ(compare(ours, theirs, "--near-ties"), 1);
}

TEST(CompareLogits, ANearTieSplitPassesOnlyWithNearTiesAfterEightPicks) {
  // Row 14 picks token 15 (pick 11 of 16): a gap of 0.01 either way, well within the bound.
  LogitsFile theirs = clear_winners(3), ours;
  const uint32_t r = 14, other = (theirs.tokens[r + 1] + 5) % kVocab;
  tie_at(theirs, r, other, 0.01f, false);
  ours = theirs;
  tie_at(ours, r, other, 0.01f, true);
  EXPECT_EQ(compare(ours, theirs), 1);
  EXPECT_EQ(compare(ours, theirs, "--near-ties"), 0);
  // The same split at pick 3: too early.
  LogitsFile early_theirs = clear_winners(3), early_ours;
  const uint32_t e = kPrompt + 1, early_other = (early_theirs.tokens[e + 1] + 5) % kVocab;
  tie_at(early_theirs, e, early_other, 0.01f, false);
  early_ours = early_theirs;
  tie_at(early_ours, e, early_other, 0.01f, true);
  EXPECT_EQ(compare(early_ours, early_theirs, "--near-ties"), 1);
}

TEST(CompareLogits, ASplitThatIsNoTieFails) {
  // Row 14's winner leads by 3 in theirs; ours moves two logits by 1.6 each to flip it: the row
  // is over the bound, and the gap (3) exceeds the largest difference (1.6).
  LogitsFile theirs = clear_winners(4);
  LogitsFile ours = theirs;
  const uint32_t r = 14, picked = theirs.tokens[r + 1], other = (picked + 5) % kVocab;
  float *row = ours.logits.data() + size_t(r) * kVocab;
  theirs.logits[size_t(r) * kVocab + other] = 3.0f;
  row[other] = 3.0f + 1.6f;
  row[picked] = 6.0f - 1.6f;
  ours.tokens[r + 1] = other;
  EXPECT_EQ(compare(ours, theirs, "--near-ties"), 1);
}

TEST(CompareLogits, ASplitWithinTheBoundButWiderThanTheDifferencesFails) {
  // Row 14: theirs leads by 0.1; ours moves both logits by 0.055 (row error about 8e-3, within
  // the bound) and flips them, but theirs' lead is wider than any difference between the rows.
  LogitsFile theirs = clear_winners(5);
  const uint32_t r = 14, picked = theirs.tokens[r + 1], other = (picked + 5) % kVocab;
  theirs.logits[size_t(r) * kVocab + other] = 6.0f - 0.1f;
  LogitsFile ours = theirs;
  float *row = ours.logits.data() + size_t(r) * kVocab;
  row[other] += 0.055f;
  row[picked] -= 0.055f;
  ours.tokens[r + 1] = other;
  EXPECT_EQ(compare(ours, theirs, "--near-ties"), 1);
}

} // namespace
} // namespace offgraph::peer
