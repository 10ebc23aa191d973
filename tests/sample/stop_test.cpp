// Stop tokens and incremental stop-string matching against a naive whole-text search.
#include "sample/stop.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace offgraph::sample {
namespace {

struct Expected {
  std::string emit; // everything shown for the whole generation
  std::optional<size_t> stop;
};

// The documented rule, the slow way: the earliest end position over all stop strings; at equal
// ends the longest string; at equal strings the lowest index.
Expected naive(const std::string &text, const std::vector<std::string> &stops) {
  size_t best_end = std::string::npos;
  std::optional<size_t> best;
  for (size_t i = 0; i < stops.size(); ++i) {
    const size_t pos = text.find(stops[i]);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stops[i].size();
    if (!best || end < best_end || (end == best_end && stops[i].size() > stops[*best].size())) {
      best = i;
      best_end = end;
    }
  }
  if (!best) return {text, std::nullopt};
  return {text.substr(0, best_end - stops[*best].size()), best};
}

bool contains_any(const std::string &s, const std::vector<std::string> &stops) {
  for (const auto &stop : stops) {
    if (s.find(stop) != std::string::npos) return true;
  }
  return false;
}

// Feeds `pieces`, checking after every push that the emitted text only ever grows as a prefix of
// the final answer (nothing emitted is later retracted) and never contains a stop string.
void run_pieces(const StopSet &set, const std::vector<std::string> &pieces, const Expected &want,
                const std::string &label) {
  StopMatcher m(set);
  std::string emitted;
  std::optional<size_t> stop;
  for (const auto &piece : pieces) {
    StopUpdate u = m.push(piece);
    emitted += u.emit;
    if (u.stop_string) {
      ASSERT_FALSE(stop) << label << ": matched twice";
      stop = u.stop_string;
    }
    ASSERT_EQ(want.emit.compare(0, emitted.size(), emitted), 0)
        << label << ": emitted text is not a prefix of the answer: '" << emitted << "'";
    ASSERT_FALSE(contains_any(emitted, set.stop_strings())) << label;
  }
  if (!stop) emitted += m.finish();
  EXPECT_EQ(emitted, want.emit) << label;
  EXPECT_EQ(stop, want.stop) << label;
}

TEST(StopStrings, HoldsBackPossiblePrefix) {
  auto set = StopSet::create({}, {"</s>", "STOP"});
  ASSERT_TRUE(set.ok());
  StopMatcher m(*set);
  StopUpdate u = m.push("Hello <");
  EXPECT_EQ(u.emit, "Hello ");
  EXPECT_EQ(m.held(), "<");
  u = m.push("/x");
  EXPECT_EQ(u.emit, "</x");
  u = m.push(" ST");
  EXPECT_EQ(u.emit, " ");
  u = m.push("OP and more");
  EXPECT_EQ(u.emit, "");
  ASSERT_TRUE(u.stop_string);
  EXPECT_EQ(*u.stop_string, 1u);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("ignored").emit, "");
}

TEST(StopStrings, FinishReleasesHeldText) {
  auto set = StopSet::create({}, {"<|end|>"});
  ASSERT_TRUE(set.ok());
  StopMatcher m(*set);
  EXPECT_EQ(m.push("answer <|en").emit, "answer ");
  EXPECT_EQ(m.finish(), "<|en");
}

TEST(StopStrings, EveryTwoAndThreeWaySplit) {
  const std::vector<std::string> stops = {"abcab", "bca", "cabd", "xyz", "zz", "\xc3\xa9t\xc3\xa9"};
  auto set = StopSet::create({}, stops);
  ASSERT_TRUE(set.ok());
  const std::vector<std::string> texts = {"xxabcabcabdzz",
                                          "abcabd",
                                          "no match here",
                                          "ab ca bc ab cab",
                                          "x\xc3\xa9t\xc3\xa9!",
                                          "xyxyxyzz",
                                          "abcab",
                                          "bc",
                                          "zzz",
                                          ""};
  for (const auto &text : texts) {
    const Expected want = naive(text, stops);
    run_pieces(*set, {text}, want, "whole '" + text + "'");
    for (size_t i = 0; i <= text.size(); ++i) {
      run_pieces(*set, {text.substr(0, i), text.substr(i)}, want, "split2 '" + text + "'");
      for (size_t j = i; j <= text.size(); ++j) {
        run_pieces(*set, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}, want,
                   "split3 '" + text + "'");
      }
    }
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    run_pieces(*set, bytes, want, "bytes '" + text + "'");
  }
}

TEST(StopStrings, LongestWinsAtSameEnd) {
  auto set = StopSet::create({}, {"c", "abc", "bc", "abc"});
  ASSERT_TRUE(set.ok());
  StopMatcher m(*set);
  StopUpdate u = m.push("xxabcd");
  EXPECT_EQ(u.emit, "xx");
  ASSERT_TRUE(u.stop_string);
  EXPECT_EQ(*u.stop_string, 1u);
}

TEST(StopStrings, FiveThousandStrings) {
  std::mt19937 gen(12345);
  auto rand_string = [&](size_t min_len, size_t max_len, const std::string &alphabet) {
    const size_t len = min_len + gen() % (max_len - min_len + 1);
    std::string s;
    for (size_t i = 0; i < len; ++i) s += alphabet[gen() % alphabet.size()];
    return s;
  };
  std::vector<std::string> stops;
  for (int i = 0; i < 5000; ++i) stops.push_back(rand_string(6, 10, "abcd"));
  auto set = StopSet::create({}, stops);
  ASSERT_TRUE(set.ok());
  int matched = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const std::string text = rand_string(20, 300, "abcde");
    const Expected want = naive(text, stops);
    if (want.stop) ++matched;
    std::vector<std::string> pieces;
    for (size_t pos = 0; pos < text.size();) {
      const size_t n = std::min<size_t>(1 + gen() % 6, text.size() - pos);
      pieces.push_back(text.substr(pos, n));
      pos += n;
    }
    run_pieces(*set, pieces, want, "trial " + std::to_string(trial));
  }
  EXPECT_GT(matched, 0);
  EXPECT_LT(matched, 40);
}

TEST(StopStrings, EmptyStringRejected) {
  auto set = StopSet::create({}, {"ok", ""});
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.message().find("empty"), std::string::npos);
}

TEST(StopTokens, Membership) {
  auto set = StopSet::create({200008, 200001, 200008}, {});
  ASSERT_TRUE(set.ok());
  EXPECT_TRUE(set->is_stop_token(200001));
  EXPECT_TRUE(set->is_stop_token(200008));
  EXPECT_FALSE(set->is_stop_token(200007));
  EXPECT_EQ(set->stop_tokens().size(), 2u);
  StopMatcher m(*set);
  EXPECT_EQ(m.push("no strings, nothing held").emit, "no strings, nothing held");
}

TEST(StopTokens, EndOfMessageNeverAStop) {
  const std::vector<int32_t> eot = {200008, 200001, 200008};
  auto ids = end_of_turn_stop_ids(eot, 200007);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{200001, 200008}));
  const std::vector<int32_t> with_eom = {200008, 200007};
  auto bad = end_of_turn_stop_ids(with_eom, 200007);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("<|eom|>"), std::string::npos);
  EXPECT_TRUE(end_of_turn_stop_ids(with_eom, std::nullopt).ok());
}

} // namespace
} // namespace offgraph::sample
