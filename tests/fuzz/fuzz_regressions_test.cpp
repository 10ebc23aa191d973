// What fuzzing found, as readable tests (the raw inputs are replayed from fuzz/regressions/ by the
// fuzz.<target>.replay tests). Each names the target and the property it broke.
#include "text/atem/atem_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace offgraph::text {
namespace {

// Feeds `text` in two pieces cut at `cut` and returns the message and every delta.
AtemMessage feed_cut(const std::string &text, size_t cut, std::vector<AtemEvent> &events) {
  AtemParser p;
  for (auto &e : p.feed(text.substr(0, cut))) events.push_back(e);
  for (auto &e : p.feed(text.substr(cut))) events.push_back(e);
  for (auto &e : p.finish()) events.push_back(e);
  return p.message();
}

// atem: a header without <|message|> that ends in a marker just inside the header length limit
// was text to the user when the stream was cut inside that marker, and nothing when it was not.
TEST(FuzzRegressions, AtemHeaderLengthDoesNotDependOnWhereTheStreamIsCut) {
  const std::string header = "assistant to=weather.get " + std::string(230, 'x');
  const std::string text = " to=self<|message|>hm<|eom|><|start|>" + header + "<|eot|>";
  const AtemMessage whole = parse_atem(text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    std::vector<AtemEvent> events;
    const AtemMessage split = feed_cut(text, cut, events);
    ASSERT_EQ(split.content, whole.content) << "cut at " << cut;
    ASSERT_EQ(split.reasoning_content, whole.reasoning_content) << "cut at " << cut;
    ASSERT_EQ(split.ended, whole.ended) << "cut at " << cut;
  }
}

// atem: text either side of a <|start|> (two messages to the user) was joined into one delta,
// which then read "<|message|>".
TEST(FuzzRegressions, AtemNoDeltaSpellsAMarkerAcrossMessages) {
  const std::string text = " to=calc.add<|<|start|>message|><atem:funct";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    std::vector<AtemEvent> events;
    (void)feed_cut(text, cut, events);
    for (const AtemEvent &e : events)
      EXPECT_EQ(e.text.find("<|message|>"), std::string::npos)
          << "cut at " << cut << ": " << e.text;
  }
}

} // namespace
} // namespace offgraph::text
