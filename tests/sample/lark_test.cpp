// parse_lark against Lark itself (vectors/lark_vectors.json, written by lark_vectors.py with
// python3-lark) and against what the grammars mean, checked by the Earley recognizer: Codex's
// apply_patch grammar (the text Codex 0.171.0 sends as its custom tool's format, read from its
// binary) on patches and near misses; each construct of the subset; Lark's common terminals;
// refusals by name.
#include "sample/grammar_exclude.h"
#include "sample/lark.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace offgraph::sample {
namespace {

// codex-rs/core tool_apply_patch.lark as @openai/codex 0.171.0 sends it (apply_patch.lark).
std::string read_file(const std::string &name) {
  std::ifstream in(std::string(OFFGRAPH_SAMPLE_TEST_DIR) + "/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  return std::string(std::istreambuf_iterator<char>(in), {});
}
const std::string kApplyPatch = read_file("apply_patch.lark");

Grammar lark(std::string_view text) {
  auto g = parse_lark(text);
  EXPECT_TRUE(g.ok()) << g.message();
  return g.ok() ? std::move(g).value() : Grammar{};
}

bool accepts(const Grammar &g, std::string_view s) {
  auto r = grammar_accepts(g, s);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() && *r;
}

std::string refusal(std::string_view text) {
  auto g = parse_lark(text);
  EXPECT_FALSE(g.ok()) << text;
  return g.ok() ? std::string() : g.message();
}

TEST(Lark, TakesWhatLarkTakes) {
  const auto vectors = nlohmann::json::parse(read_file("vectors/lark_vectors.json"));
  size_t checked = 0, accepted = 0;
  for (const auto &g : vectors["grammars"]) {
    const Grammar grammar = lark(g["grammar"].get<std::string>());
    for (const auto &c : g["cases"]) {
      const std::string text = c["text"];
      EXPECT_EQ(accepts(grammar, text), c["accepted"].get<bool>())
          << g["name"].get<std::string>() << ": " << nlohmann::json(text).dump();
      ++checked;
      accepted += c["accepted"].get<bool>();
    }
  }
  EXPECT_GT(checked, 800u);
  EXPECT_GT(accepted, 100u);
}

TEST(Lark, ApplyPatchGrammarTakesCodexPatches) {
  const Grammar g = lark(kApplyPatch);
  EXPECT_TRUE(
      accepts(g, "*** Begin Patch\n*** Add File: hello.txt\n+Hello, World!\n*** End Patch"));
  EXPECT_TRUE(accepts(g, "*** Begin Patch\n*** Update File: src/main.py\n@@ def main():\n"
                         " def main():\n-    print('old')\n+    print('new <b>&</b>')\n"
                         "*** End Patch\n"));
  EXPECT_TRUE(accepts(g, "*** Begin Patch\n*** Update File: a.c\n*** Move to: b.c\n@@\n-x\n+y\n"
                         "*** End of File\n*** Delete File: c.c\n*** End Patch\n"));
  EXPECT_TRUE(accepts(g, "*** Begin Patch\n*** Update File: empty.txt\n*** End Patch"));
  EXPECT_TRUE(accepts(g, "*** Begin Patch\n*** Add File: e\n+\n*** End Patch"));

  EXPECT_FALSE(accepts(g, "*** Add File: a\n+x\n*** End Patch"));                 // no begin
  EXPECT_FALSE(accepts(g, "*** Begin Patch\n*** Add File: a\n+x\n"));             // no end
  EXPECT_FALSE(accepts(g, "*** Begin Patch\n*** End Patch"));                     // no hunk
  EXPECT_FALSE(accepts(g, "*** Begin Patch\n*** Add File: a\n*** End Patch"));    // no line
  EXPECT_FALSE(accepts(g, "*** Begin Patch\n*** Add File: a\nx\n*** End Patch")); // no '+'
  EXPECT_FALSE(accepts(g, "*** Begin Patch\n*** Add File: \n+x\n*** End Patch")); // no name
  EXPECT_FALSE(accepts(g, "*** Begin Patch\n*** Update File: a\n@@\nx\n*** End Patch"));
  EXPECT_FALSE(accepts(g, "*** Begin Patch\n*** Delete File: a\n*** End Patch\n\n"));
}

TEST(Lark, ApplyPatchWithoutChatMarkersKeepsAngleBrackets) {
  // What the ATEM tool call does with it: every patch that spells no marker stays.
  const Grammar g = lark(kApplyPatch);
  const std::vector<std::string> markers = {"<|", "<atem:", "</atem:"};
  auto f = exclude_substrings(g, markers);
  ASSERT_TRUE(f.ok()) << f.message();
  const std::string html = "*** Begin Patch\n*** Add File: a.html\n+<div a=\"<|\">\n*** End Patch";
  const std::string ok = "*** Begin Patch\n*** Add File: a.h\n+template <typename T> x<y>;\n"
                         "+</div> <atem\n*** End Patch";
  EXPECT_TRUE(accepts(*f, ok));
  EXPECT_FALSE(accepts(*f, html));
  EXPECT_FALSE(accepts(*f, "*** Begin Patch\n*** Add File: a\n+x</atem:parameter>\n*** End Patch"));
  EXPECT_TRUE(accepts(g, html)); // only the markers went
}

TEST(Lark, EachConstructMeansWhatLarkSays) {
  const Grammar g = lark(R"(
// a comment
?start: item+ -> items
item: "a".."c"           // a range
    | "x"i "y"             // case-folded
    | NUM ~ 2..3 ";"
    | [ "o" ] "p"
    | "q" ~ 2
!NUM: "0".."9"
)");
  for (const char *s : {"a", "abc", "xy", "Xy", "12;", "123;", "p", "op", "qq", "aXyop12;"})
    EXPECT_TRUE(accepts(g, s)) << s;
  for (const char *s : {"", "d", "xY", "1;", "1234;", "oo p", "q", "qqq"})
    EXPECT_FALSE(accepts(g, s)) << s;
}

TEST(Lark, EscapesAsLarkReadsThem) {
  // Lark's eval_escaping: \n \t \r \f \\ \" \x \u \U; any other backslash stays as it is.
  const Grammar g = lark(R"(start: "\q\v\0" "\x41\u00e9\"\\" "\n")");
  EXPECT_TRUE(accepts(g, "\\q\\v\\0A\xC3\xA9\"\\\n"));
  EXPECT_FALSE(accepts(g, "q\v"));
}

TEST(Lark, IgnoredTextStandsBetweenTokens) {
  const Grammar g = lark(R"(
start: pair ("," pair)*
pair: KEY "=" INT
KEY: /[a-z]+/
%import common (INT, WS)
%ignore WS
)");
  EXPECT_TRUE(accepts(g, "a=1,b=22"));
  EXPECT_TRUE(accepts(g, "  a = 1 ,\n b=22  "));
  EXPECT_FALSE(accepts(g, "a b=1")); // not inside a terminal
  EXPECT_FALSE(accepts(g, "a=1 2"));
}

TEST(Lark, CommonTerminals) {
  const Grammar g = lark(R"(
start: ESCAPED_STRING | "n" SIGNED_NUMBER | C_COMMENT | CNAME
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.C_COMMENT
%import common.CNAME
)");
  for (const char *s : {"\"a\\\"b\"", "\"\"", "n-1.5e-3", "n42", "n.5", "/* a * b */", "_x9"})
    EXPECT_TRUE(accepts(g, s)) << s;
  for (const char *s : {"\"a\"b\"", "\"a\\\"", "n1e+", "/* a */ */", "9x"})
    EXPECT_FALSE(accepts(g, s)) << s;
  const Grammar aliased = lark("start: N\n%import common.INT -> N\n");
  EXPECT_TRUE(accepts(aliased, "007"));
}

TEST(Lark, RefusesByName) {
  EXPECT_NE(refusal("start: A\nA.2: \"a\"").find("priorities"), std::string::npos);
  EXPECT_NE(refusal("start: /a/i").find("flag 'i'"), std::string::npos);
  EXPECT_NE(refusal("start: x{\"a\"}").find("templates"), std::string::npos);
  EXPECT_NE(refusal("start: \"a\"\n%declare B").find("'%declare'"), std::string::npos);
  EXPECT_NE(refusal("start: b").find("'b' is used but never defined"), std::string::npos);
  EXPECT_NE(refusal("s: \"a\"").find("no 'start' rule"), std::string::npos);
  EXPECT_NE(refusal("start: A\n%import common.NOPE").find("common.NOPE"), std::string::npos);
  EXPECT_NE(refusal("start: A\n%import other.A").find("only '%import common'"), std::string::npos);
  EXPECT_NE(refusal("start: start \"a\" | \"b\"").find("recurs"), std::string::npos);
  EXPECT_NE(refusal("start: \"a\" \"b").find("runs past its line"), std::string::npos);
  EXPECT_NE(refusal("start: /a\\").find("runs past its line"), std::string::npos);
  EXPECT_NE(refusal("start: \"a\\").find("runs past its line"), std::string::npos);
  // Size is refused before it is allocated.
  std::string big = "start:";
  for (int i = 0; i < 200; ++i) big += " \"a\"~0..10000";
  EXPECT_NE(refusal(big).find("grows past"), std::string::npos);
  EXPECT_NE(refusal("start: \"a\"\nstart: \"b\"").find("defined twice"), std::string::npos);
}

} // namespace
} // namespace offgraph::sample
