// The GBNF parser against llama.cpp's grammars (read from the pinned tree), against the accept
// and reject cases of llama.cpp's tests/test-grammar-integration.cpp and test-grammar-parser.cpp
// (restated as facts, through grammar_accepts), and against its own error messages.
#include "sample/gbnf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace offgraph::sample {
namespace {

#ifndef OFFGRAPH_LLAMA_GRAMMARS_DIR
#define OFFGRAPH_LLAMA_GRAMMARS_DIR ""
#endif

Grammar parse(std::string_view text, const GbnfOptions &options = {}) {
  auto g = parse_gbnf(text, options);
  EXPECT_TRUE(g.ok()) << g.message() << "\n--- grammar:\n" << text;
  return g.ok() ? std::move(g).value() : Grammar{};
}

// Every string of `good` is a sentence of the grammar and none of `bad` is.
void expect_language(std::string_view text, const std::vector<std::string> &good,
                     const std::vector<std::string> &bad) {
  auto g = parse_gbnf(text);
  ASSERT_TRUE(g.ok()) << g.message() << "\n--- grammar:\n" << text;
  for (const std::string &s : good) {
    auto r = grammar_accepts(*g, s);
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_TRUE(*r) << "should accept: '" << s << "'\n--- grammar:\n" << text;
  }
  for (const std::string &s : bad) {
    auto r = grammar_accepts(*g, s);
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_FALSE(*r) << "should reject: '" << s << "'\n--- grammar:\n" << text;
  }
}

std::string error_of(std::string_view text, const GbnfOptions &options = {}) {
  auto g = parse_gbnf(text, options);
  EXPECT_FALSE(g.ok()) << "should fail:\n" << text << "\n--- parsed as:\n" << g->to_text();
  return g.ok() ? std::string() : g.message();
}

// `text` is refused with a message holding each of `parts`.
void expect_error(std::string_view text, std::initializer_list<std::string_view> parts) {
  const std::string message = error_of(text);
  for (std::string_view part : parts) {
    EXPECT_NE(message.find(part), std::string::npos)
        << "message '" << message << "' lacks '" << part << "'\n--- grammar:\n"
        << text;
  }
}

std::filesystem::path grammars_dir() { return OFFGRAPH_LLAMA_GRAMMARS_DIR; }

std::string read_file(const std::filesystem::path &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

#define REQUIRE_GRAMMARS()                                                                         \
  do {                                                                                             \
    if (!std::filesystem::is_directory(grammars_dir()))                                            \
      GTEST_SKIP() << "no llama.cpp grammars directory at '" << grammars_dir().string() << "'";    \
  } while (0)

// Reads llama.cpp's grammars/<name> and checks its language.
void expect_llama_grammar(const std::string &name, const std::vector<std::string> &good,
                          const std::vector<std::string> &bad) {
  const std::string text = read_file(grammars_dir() / name);
  ASSERT_FALSE(text.empty()) << name;
  expect_language(text, good, bad);
}

// --- llama.cpp's grammars -------------------------------------------------------------------

TEST(GbnfLlamaGrammars, EveryGrammarParses) {
  REQUIRE_GRAMMARS();
  std::vector<std::filesystem::path> files;
  for (const auto &entry : std::filesystem::directory_iterator(grammars_dir())) {
    if (entry.path().extension() == ".gbnf") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  // arithmetic c chess english japanese json json_arr list in the pinned tree.
  EXPECT_GE(files.size(), 8u);
  for (const auto &path : files) {
    auto g = parse_gbnf(read_file(path));
    EXPECT_TRUE(g.ok()) << path.filename().string() << ": " << g.message();
  }
}

TEST(GbnfLlamaGrammars, Json) {
  REQUIRE_GRAMMARS();
  expect_llama_grammar("json.gbnf",
                       {"{}", "{ }", R"({"a": 1})",
                        R"({"a":1,"b":[1, 2.5, -3, true, false, null]})",
                        R"({"k": {"n": "caf\u00e9 é ✅", "e": "\"\\\n"}})",
                        "{\"a\": [\n  {}, []\n]}", "{} ", R"({"n": 1e5, "m": -0.25E-19})"},
                       {"", "[1]", "{", R"({"a":})", "{a: 1}", R"({"a": 01})", "{\"a\": \"\x01\"}",
                        R"({"a": 1,})", R"({"a": "\q"})", R"({"a": 1e10})", "{}  "});
}

TEST(GbnfLlamaGrammars, Arithmetic) {
  REQUIRE_GRAMMARS();
  expect_llama_grammar("arithmetic.gbnf",
                       {"1+2=3\n", "x*(y+1)=z\n", "a=b\nc=d\n", "( x ) = 12 \n", "a1_b=0\n"},
                       {"", "1+2=3", "=3\n", "1++2=3\n", "(x=1\n", "X=1\n"});
}

TEST(GbnfLlamaGrammars, List) {
  REQUIRE_GRAMMARS();
  expect_llama_grammar(
      "list.gbnf", {"- a\n", "- milk\n- eggs\n", "- café ✅\n", "- \t x\n"},
      {"", "- \n", "-a\n", "- a", "- a\rb\n", "- a\u2028b\n", "- a\u0085\n", "- a\n\n"});
}

TEST(GbnfLlamaGrammars, Chess) {
  REQUIRE_GRAMMARS();
  expect_llama_grammar("chess.gbnf",
                       {"1. e4 e5\n2. Nf3 Nc6\n", "1. e4 e5\n2. O-O O-O-O\n",
                        "1. d4 d5\n10. Qxd5+ exd8=Q#\n", "1. e4 e5\n2. Nbd2 R1a3\n3. a3 h6\n"},
                       {"", "1. e4 e5\n", "1. e9 e5\n2. a3 a4\n", "1. e4 e5\n100. a3 a4\n",
                        "1. e4 e5\n2. Pe4 a4\n", "1. e4 e5\n02. a3 a4\n", "1. e4  e5\n2. a3 a4\n"});
}

TEST(GbnfLlamaGrammars, Japanese) {
  REQUIRE_GRAMMARS();
  expect_llama_grammar("japanese.gbnf",
                       {"こんにちは", "日本語 カタカナ", "ひらがな、カタカナ。", "一\t鿿\nぁ"},
                       {"", "hello", "日本 ", "日本  語", "한국어", " 日本", "日本!"});
}

TEST(GbnfLlamaGrammars, EnglishAndC) {
  REQUIRE_GRAMMARS();
  expect_llama_grammar("english.gbnf", {"Hello, world!", "a [b] \\c\\ {d}", "x\ty\nz"},
                       {"", "hello  world", "héllo", "trailing "});
  expect_llama_grammar("c.gbnf",
                       {"int main(){return 0;}", "int f(int x){x = x+1;while(x<10){x = x*2;}}",
                        "float g(){/* note */h (1,  2);}"},
                       {"int main(){return 0}", "main(){}", "int f(){x=;}"});
}

// --- facts from llama.cpp's tests/test-grammar-integration.cpp -----------------------------

TEST(GbnfLlamaIntegration, SimpleAndMediumGrammars) {
  expect_language(R"(
            root ::= expr
            expr ::= term ("+" term)*
            term ::= number
            number ::= [0-9]+)",
                  {"42", "1+2+3+4+5", "123+456"}, {"+", "/ 3", "1+2+3+4+5+", "12a45"});
  expect_language(R"g(
            root ::= expression
            expression ::= term ws (("+"|"-") ws term)*
            term ::= factor ws (("*"|"/") ws factor)*
            factor ::= number | variable | "(" expression ")" | function-call
            number ::= [0-9]+
            variable ::= [a-zA-Z_][a-zA-Z0-9_]*
            function-call ::= variable ws "(" (expression ("," ws expression)*)? ")"
            ws ::= [ \t\n\r]?)g",
                  {"42", "1*2*3*4*5", "x", "x+10", "x1+y2", "(a+b)*(c-d)", "func()", "func(x,y+2)",
                   "a*(b+c)-d/e", "f(g(x),h(y,z))", "x + 10", "(a + b) * (c - d)", "func(x, y + 2)",
                   "f(g(x), h(y, z))", "123*456*789-123/456+789*123"},
                  {"+", "/ 3x", "x + + y", "a * / b", "func(,)", "func(x y)", "(a + b", "x + y)",
                   "a + b * (c - d", "42 +", "x +", "func(", "func(x, y + 2", "f(g(x), h(y, z)"});
}

TEST(GbnfLlamaIntegration, AnyCharCountsCodePoints) {
  expect_language(R"(root ::= ... "abc" ...)",
                  {"abcabcabc", "aaaabcccc", "🔵🟠✅abc❌🟠🔵"},
                  {"aaabcccc", "aaaaabcccc", "aaaabccc", "aaaabccccc",
                   "🔵🟠✅❌abc❌✅🟠🔵", "🔵🟠abc🟠🔵"});
}

TEST(GbnfLlamaIntegration, Quantifiers) {
  const std::string many_a(62, 'a');
  expect_language(R"(root ::= "a"*)", {"", "a", "aaaaa", many_a},
                  {"b", "ab", "aab", "ba", many_a + "b"});
  expect_language(R"(root ::= "a"+)", {"a", "aaaaa", many_a}, {"", "b", "ab", "ba", many_a + "b"});
  expect_language(R"(root ::= "a"?)", {"", "a"}, {"b", "ab", "aa", "ba"});
  expect_language(R"(
            root ::= cons+ vowel* cons? (vowel cons)*
            vowel ::= [aeiouy]
            cons ::= [bcdfghjklmnpqrstvwxyz]
            )",
                  {"yes", "no", "noyes", "crwth", "four", "bryyyy"},
                  {"yess", "yesno", "forty", "catyyy"});
  expect_language("root ::= [ab]{4}", {"aaaa", "bbbb", "abab"}, {"a", "b", "aaaaa"});
  expect_language("root ::= [ab]{4,}", {"aaaa", "aaaaab", "bbbb", "ababab"}, {"", "aba"});
  expect_language("root ::= [ab]{0,4}", {"", "a", "aa", "aaa", "aaab"}, {"aaaaa"});
  expect_language(R"(root ::= ("0x" [A-F0-9]{2} " "?){3,5})",
                  {"0xFF 0x12 0xAB", "0xFF 0x12 0xAB 0x00 0x00"},
                  {"", "0xFF", "0xFF 0x12", "0xFF 0x12 0xAB 0x00 0x00 0x00"});
}

// llama.cpp's "segfault" case: a repetition of what may be empty (here an unbounded one, which
// our right recursion would make left-recursive if written out directly).
TEST(GbnfLlamaIntegration, RepetitionOfWhatMayBeEmpty) {
  expect_language("root ::= ( [x]* )*", {"", "x", "xx"}, {"y", "yy"});
  expect_language(R"(root ::= ("a"? "b"?)+ "c")", {"c", "ac", "bc", "abababbbaac", "baac"},
                  {"", "a", "cc", "abca"});
  expect_language(R"(
    root ::= item* "."
    item ::= ws word ws
    word ::= [a-z]+ | ""
    ws ::= " "*)",
                  {".", "  .", "ab cd .", "a."}, {"", "A.", "a. "});
  // Only the empty string: the repetition adds nothing.
  expect_language(R"(root ::= e* "z"
    e ::= "" | ("")
    )",
                  {"z"}, {"", "zz"});
}

TEST(GbnfLlamaIntegration, RefusedGrammars) {
  expect_error(R"(
        rot ::= expr
        expr ::= term ("+" term)*
        term ::= number
        number ::= [0-9]+)",
               {"no 'root' rule"});
  expect_error(R"(root ::= expr
        expr ::= term ("+" term)*
        term ::= numero
        number ::= [0-9]+)",
               {"gbnf:3:18: undefined rule 'numero'"});
  expect_error(R"(root ::= "a" | root "a")", {"left-recursive", "root"});
  expect_error(R"(
        root ::= asdf
        asdf ::= "a" | asdf "a"
        )",
               {"left-recursive", "asdf"});
  expect_error(R"(
        root ::= asdf
        asdf ::= "a" | foo "b"
        foo ::= "c" | asdf "d" | "e")",
               {"left-recursive"});
  expect_error(R"(
        root ::= asdf
        asdf ::= "a" | foo "b"
        foo ::= "c" | empty asdf "d" | "e"
        empty ::= "blah" | )",
               {"left-recursive"});
}

TEST(GbnfLlamaIntegration, Tokens) {
  std::vector<std::string> asked;
  GbnfOptions options;
  options.special_token = [&](std::string_view ref) -> std::optional<int32_t> {
    asked.emplace_back(ref);
    if (auto id = gbnf_token_id(ref)) return id;
    if (ref == "<think>") return 1000;
    if (ref == "<|eot_id|>") return 128009;
    return std::nullopt;
  };
  const Grammar g = parse("root ::= <[10]> [a-z ]* (<think> | <|eot_id|>)", options);
  EXPECT_EQ(asked, (std::vector<std::string>{"<[10]>", "<think>", "<|eot_id|>"}));
  auto symbols = [](std::string_view text, std::initializer_list<int32_t> before,
                    std::initializer_list<int32_t> after) {
    std::vector<int32_t> out;
    for (int32_t id : before) out.push_back(256 + id);
    for (char c : text) out.push_back(uint8_t(c));
    for (int32_t id : after) out.push_back(256 + id);
    return out;
  };
  EXPECT_TRUE(*grammar_accepts_symbols(g, symbols("hello world", {10}, {1000})));
  EXPECT_TRUE(*grammar_accepts_symbols(g, symbols("", {10}, {128009})));
  EXPECT_FALSE(*grammar_accepts_symbols(g, symbols("hello", {11}, {1000})));
  EXPECT_FALSE(*grammar_accepts_symbols(g, symbols("hello", {10}, {})));
  // The text of a token is not the token.
  EXPECT_FALSE(*grammar_accepts(g, "<[10]>hi<think>"));
  EXPECT_EQ(gbnf_token_id("<[0]>"), 0);
  EXPECT_EQ(gbnf_token_id("<[2147483647]>"), 2147483647);
  EXPECT_EQ(gbnf_token_id("<[2147483648]>"), std::nullopt);
  EXPECT_EQ(gbnf_token_id("<[]>"), std::nullopt);
  EXPECT_EQ(gbnf_token_id("<[1a]>"), std::nullopt);
  EXPECT_EQ(gbnf_token_id("<think>"), std::nullopt);

  // Unknown tokens, no resolver, negation.
  std::string m = error_of("root ::= \"a\" <|nope|>", options);
  EXPECT_NE(m.find("gbnf:1:14: unknown token '<|nope|>'"), std::string::npos) << m;
  m = error_of("root ::= <[5]>");
  EXPECT_NE(m.find("gbnf:1:10: cannot resolve the token '<[5]>': no vocabulary"), std::string::npos)
      << m;
  auto negated = parse_gbnf("root ::= <[10]> (!<[11]>)* <[11]>", options);
  ASSERT_FALSE(negated.ok());
  EXPECT_EQ(negated.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(
      negated.message().find("gbnf:1:18: '!<[11]>' (any token but this one) is not supported"),
      std::string::npos)
      << negated.message();
  m = error_of("root ::= <[99999999999]>", options);
  EXPECT_NE(m.find("past the largest id"), std::string::npos) << m;
  options.special_token = [](std::string_view) -> std::optional<int32_t> { return -1; };
  m = error_of("root ::= <x>", options);
  EXPECT_NE(m.find("unknown token '<x>'"), std::string::npos) << m;
}

// --- facts from llama.cpp's tests/test-grammar-parser.cpp ----------------------------------

TEST(GbnfLlamaParser, RepetitionBounds) {
  // llama.cpp refuses a count missing before ',' ...
  expect_error("root ::= \"a\"{,}", {"gbnf:1:14: expected a count after '{', found ','"});
  expect_error("root ::= \"a\"{,10}", {"gbnf:1:14: expected a count after '{'"});
  // ... allows spaces inside the braces ...
  expect_language(R"(root ::= "a"{ 4})", {"aaaa"}, {"aaa", "aaaaa"});
  expect_language(R"(root ::= "a"{ 2 , 3 })", {"aa", "aaa"}, {"a", "aaaa"});
  // ... and reads a maximum past its limit as no maximum: ours is kMaxRepeatBound. (Compared as
  // grammars: grammar_accepts is far too slow for 10000 bytes.)
  EXPECT_EQ(parse("root ::= \"a\"{2,10001}").to_text(), parse("root ::= \"a\"{2,}").to_text());
  // Bounds within our limit are exact (llama.cpp refuses {5000} and reads {0,5000} as {0,}).
  EXPECT_GT(parse("root ::= \"a\"{0,10000}").rules.size(), 10000u);
  expect_language("root ::= \"a\"{0,300}", {"", std::string(300, 'a')}, {std::string(301, 'a')});
  EXPECT_TRUE(parse_gbnf("root ::= \"a\"{5000}").ok());
  expect_error("root ::= \"a\"{10001}", {"gbnf:1:13: the repetition '{10001}'", "10000"});
  expect_error("root ::= \"a\"{99999999999999999999999,}", {"gbnf:1:13", "more than 10000"});
  expect_error("root ::= \"a\"{5,2}", {"gbnf:1:13: the repetition '{5,2}' has its minimum above"});
  expect_error("root ::= \"a\"{2", {"gbnf:1:15: expected '}' to close the '{' at 1:13"});
  expect_error("root ::= \"a\"{2;}", {"gbnf:1:15: expected '}'", "';'"});
}

TEST(GbnfLlamaParser, NestedRepetitionsDoNotMultiply) {
  // llama.cpp refuses this one (99^6 copies if written out); ours are rules that refer to each
  // other, about 600 of them.
  const Grammar g = parse("root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}");
  EXPECT_LT(g.rules.size(), 1000u);
  EXPECT_TRUE(*grammar_accepts(g, ""));
  EXPECT_TRUE(*grammar_accepts(g, "ab"));
  EXPECT_FALSE(*grammar_accepts(g, "x"));
}

TEST(GbnfLlamaParser, ShapesOfTheParserTests) {
  expect_language(R"(root  ::= "a" | [bdx-z] | [^1-3])", {"a", "b", "d", "y", "4", "c", "é"},
                  {"1", "2", "3", "", "ab"});
  expect_language("root ::= a+\na ::= \"a\"", {"a", "aaa"}, {""});
  expect_language("root ::= a?\na ::= \"a\"", {"", "a"}, {"aa"});
  expect_language("root ::= a*\na ::= \"a\"", {"", "aaaa"}, {"b"});
  expect_language("root ::= \"a\"{2,}", {"aa", "aaaaaa"}, {"a"});
  expect_language("root ::= \"a\"{2,4}", {"aa", "aaa", "aaaa"}, {"a", "aaaaa"});
  expect_language(R"(
        root  ::= (expr "=" term "\n")+
        expr  ::= term ([-+*/] term)*
        term  ::= [0-9]+
    )",
                  {"1+2=3\n", "12=12\n4*5=20\n"}, {"1+2=3", "a=1\n"});
}

// --- syntax and errors -----------------------------------------------------------------------

TEST(GbnfSyntax, NewlinesEndRulesExceptAfterBarsAndInsideParentheses) {
  // A body may start on the line after '::=', and go on after '|' or inside parentheses.
  expect_language("root ::=\n  \"a\" |\n  \"b\"\n", {"a", "b"}, {"", "ab"});
  expect_language("root ::= (\n  \"a\"\n  \"b\"\n  | \"c\"\n)\n", {"ab", "c"}, {"a", "b"});
  // A newline before '|' ends the rule.
  expect_error("root ::= \"a\"\n| \"b\"\n",
               {"gbnf:2:1: expected a rule name, found '|'", "only after '::=' or '|'"});
  // CRLF and CR line ends, comments everywhere.
  expect_language("# head\r\nroot ::= a # tail\r\na ::= \"x\" |\r\n  \"y\"#c\rb ::= \"z\"",
                  {"x", "y"}, {"z"});
  // Nothing at all after '::=' is the empty string.
  expect_language("root ::= e \"a\"\ne ::=", {"a"}, {"aa"});
  // A rule defined twice takes the later definition, as in llama.cpp.
  expect_language("root ::= \"a\"\nroot ::= \"b\"", {"b"}, {"a"});
  // The name and '::=' share a line.
  expect_error("root\n::= \"a\"", {"gbnf:1:5: expected '::=' after the rule name 'root'"});
}

TEST(GbnfSyntax, EmptyAlternativesAndGroups) {
  expect_language(R"(root ::= | "a" | ("b" | ) "c")", {"", "a", "bc", "c"}, {"b", "ac"});
  expect_language(R"(root ::= "" "x" ("") ())", {"x"}, {""});
  expect_language(R"(root ::= (((("a"))))+)", {"a", "aa"}, {""});
}

TEST(GbnfSyntax, NestedRepetitionsStackAndCount) {
  // Postfixes apply to what the previous one made: x{2}{3} is x{6}, x{2}? is (x x)?.
  expect_language(R"(root ::= "a"{2}{3})", {std::string(6, 'a')}, {"aa", std::string(7, 'a')});
  expect_language(R"(root ::= "ab"{2}?)", {"", "abab"}, {"ab", "ababab"});
  expect_language(R"(root ::= ("a" "b"?){2,3} "c")", {"aac", "abac", "abababc", "aaac"},
                  {"ac", "aaaac", "abbc"});
  expect_language(R"(root ::= (("x" [0-9]{1,2})+ ";"){2})", {"x1;x22x3;", "x0;x99;"},
                  {"x1;", "x123;x1;", "x;x1;"});
  expect_language(R"(root ::= "a"{0})", {""}, {"a"});
  expect_language(R"(root ::= "a"{0} "b")", {"b"}, {"ab"});
  expect_language(R"(root ::= "a"*?)", {"", "aaa"}, {"b"});
  expect_language(R"(root ::= "a"+*)", {"", "aaa"}, {"b"});
}

TEST(GbnfSyntax, UnicodeClasses) {
  expect_language(R"(root ::= [^\x00-\x7F]+)", {"é", "日本", "🔵", "\u0080\U0010FFFF"},
                  {"", "a", "é!", "\x80", "\xC3", "\xED\xA0\x80", "\xF4\x90\x80\x80"});
  expect_language(R"(root ::= [ぁ-ゟ]+)", {"ひらがな"}, {"カ", "a"});
  expect_language(R"(root ::= [\u00e9\U0001F535-\U0001F536a-c]*)", {"", "éa🔵🔶", "cbaé"},
                  {"d", "🔴"});
  // A '-' first or last is a member; escapes spell ']' and '-' and '^'.
  expect_language(R"(root ::= [-a] [a-] [\]\-^] [a^])", {"-a]a", "a-^^", "---a"},
                  {"ba]a", "-a]b", "-a]"});
  // Negation is over code points, not bytes.
  expect_language(R"(root ::= [^é] "!")", {"e!", "è!", "🔵!"}, {"é!", "\xC3!", "\xA9!"});
}

TEST(GbnfSyntax, AnyCodePoint) {
  expect_language("root ::= . .", {"ab", "é🔵", "\U0010FFFF\x01"},
                  {"a", "abc", "🔵", "\xF0\x9F\x94", "\xF0\x9F\x94\xB5\xB5", "a\xFF",
                   "a\xED\xA0\x80", "a\xC0\x80"});
  expect_language("root ::= .", {"\xF0\x9F\x94\xB5"}, {"\xF0\x9F\x94", "\xF8\x88\x80\x80\x80"});
}

TEST(GbnfSyntax, Escapes) {
  expect_language(R"(root ::= "\n\r\t\\\"\[\]\-")", {"\n\r\t\\\"[]-"}, {"\\n"});
  // Hex escapes are code points, written as UTF-8.
  expect_language(R"(root ::= "\x41\xe9\u65E5\U0001F535")", {"Aé日🔵"}, {"A\xE9"});
  expect_language(R"(root ::= "\x00" [\x00])", {std::string("\0\0", 2)}, {""});
  expect_language("root ::= \"é日🔵\" # raw UTF-8", {"é日🔵"}, {"e"});
  // A literal may hold a newline.
  expect_language("root ::= \"a\nb\"", {"a\nb"}, {"ab"});
}

TEST(GbnfErrors, EachNamesWhereAndWhat) {
  expect_error("", {"no 'root' rule"});
  expect_error("# only a comment\n", {"no 'root' rule"});
  expect_error("a ::= \"x\"", {"no 'root' rule"});
  expect_error("root ::= \"abc", {"gbnf:1:10: unterminated string literal"});
  expect_error("root ::= [abc", {"gbnf:1:10: unterminated character class"});
  expect_error("root ::= [a-", {"gbnf:1:10: unterminated character class"});
  expect_error("root ::= (\"a\" | \"b\"", {"gbnf:1:10: this '(' is never closed"});
  expect_error("root ::= (\"a\" ]",
               {"gbnf:1:15: expected ')' to close the '(' at 1:10, found ']'"});
  expect_error("root ::= \"a\")", {"gbnf:1:13: unexpected ')' in rule 'root' (no '(' to close)"});
  expect_error("root ::= my_rule", {"gbnf:1:12: unexpected '_'", "letters, digits and '-'"});
  expect_error("root ::= \"\\q\"", {"gbnf:1:11: unknown escape '\\' followed by 'q'"});
  expect_error("root ::= \"\\x4\"", {"gbnf:1:11: the escape '\\x' needs 2 hex digits"});
  expect_error("root ::= [\\u12G4]", {"gbnf:1:11: the escape '\\u' needs 4 hex digits"});
  expect_error("root ::= \"\\U00110000\"",
               {"gbnf:1:11: the escape '\\U00110000' is past U+10FFFF"});
  expect_error("root ::= \"\\", {"gbnf:1:11: '\\' at the end of the grammar"});
  expect_error("root ::= [z-a]", {"gbnf:1:11: the range 'z-a' is reversed (U+007A > U+0061)"});
  expect_error("root ::= []", {"gbnf:1:10: '[]' is an empty character class"});
  expect_error("root ::= [^]", {"gbnf:1:10: '[^]' is an empty character class"});
  expect_error("root ::= * \"a\"", {"gbnf:1:10: '*' has nothing before it to repeat"});
  expect_error("root ::= \"a\" | +", {"gbnf:1:16: '+' has nothing before it to repeat"});
  expect_error("root ::= \"\"?", {"gbnf:1:12: '?' has nothing before it to repeat"});
  expect_error("root ::= \"a\"{0}*", {"gbnf:1:16: '*' has nothing before it to repeat"});
  expect_error("root ::= x\nx ::= y\n\ny ::= zz", {"gbnf:4:7: undefined rule 'zz'"});
  expect_error("root ::= \"a\"\n  ::= \"b\"", {"gbnf:2:3: expected a rule name, found ':'"});
  expect_error("root := \"a\"", {"gbnf:1:6: expected '::=' after the rule name 'root', found ':'"});
  expect_error("root ::= < abc", {"gbnf:1:10: this '<' has no closing '>'"});
  expect_error("root ::= <[12", {"gbnf:1:14: expected ']' after the token id"});
  expect_error("root ::= <[x]>", {"gbnf:1:12: expected a token id after '<[', found 'x'"});
  expect_error("root ::= !\"a\"", {"gbnf:1:11: expected a token such as <[123]> after '!'"});
  expect_error("root ::= \"a\" \x0B", {"gbnf:1:14: unexpected control character U+000B"});
  // Columns count code points; lines count LF, CRLF and CR.
  expect_error("root ::= \"日本\" )", {"gbnf:1:15: unexpected ')'"});
  expect_error("a ::= \"x\"\r\nb ::= \"y\"\rroot ::= ?", {"gbnf:3:10: '?' has nothing"});
  expect_error("root ::= \"a\xFF\"", {"gbnf:1:12: invalid UTF-8 at byte \\xFF"});
  expect_error("root ::= \"\xC0\x80\"", {"gbnf:1:11: invalid UTF-8"});
  expect_error(std::string_view("root ::= \"a\0\"", 13), {"gbnf:1:12: a raw NUL byte"});
  // Left recursion and limits, from the builder.
  expect_error("root ::= root \"a\" | \"b\"", {"gbnf: rule 'root' is left-recursive"});
  expect_error("root ::= \"\" root", {"left-recursive"});
}

TEST(GbnfErrors, MessagesAreValidUtf8) {
  GbnfOptions options;
  options.special_token = [](std::string_view) -> std::optional<int32_t> { return std::nullopt; };
  const std::string m = error_of("root ::= <\xFF\x01é>", options);
  EXPECT_NE(m.find("unknown token '<\\xFF\\x01é>'"), std::string::npos) << m;
}

// --- limits and robustness -------------------------------------------------------------------

TEST(GbnfLimits, NestingDepth) {
  auto nested = [](int depth) {
    return "root ::= " + std::string(size_t(depth), '(') + "\"a\"" +
           std::string(size_t(depth), ')');
  };
  expect_language(nested(kMaxGbnfNesting), {"a"}, {""});
  expect_error(nested(kMaxGbnfNesting + 1), {"parentheses nest deeper than 256 levels"});
  expect_error("root ::= " + std::string(100000, '('), {"parentheses nest deeper than 256"});
}

TEST(GbnfLimits, SizeAndRepetitionBlowUp) {
  expect_error(std::string(kMaxGbnfBytes + 1, ' '), {"the limit is"});
  // Each of these is small text for a large grammar: refused as it grows, not after.
  const auto start = std::chrono::steady_clock::now();
  std::string many = "root ::=";
  for (int i = 0; i < 1000; ++i) many += " \"a\"{0,10000}";
  expect_error(many, {"grows past 100000 rules"});
  std::string wide = "root ::=";
  for (int i = 0; i < 1000; ++i) wide += " \"a\"{10000}";
  expect_error(wide, {"grows past 1000000 elements"});
  expect_error("root ::= \"" + std::string(1100000, 'x') + "\"", {"grows past 1000000 elements"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// Random bytes, and random edits of llama.cpp's grammars: an error or a grammar, never a crash.
TEST(GbnfLimits, GarbageIsRefusedOrParsed) {
  std::mt19937 gen(20240611);
  static constexpr char kAlphabet[] = "ab-09 \t\n\r#\"\\[]^()|*+?{},.<>!:=xuU\xC3\xA9\xFF\x00";
  const std::string alphabet(kAlphabet, sizeof(kAlphabet) - 1);
  std::vector<std::string> seeds = {"root ::= (\"a\" [b-c]* | x{1,3})+\nx ::= [^\\n] .\n"};
  if (std::filesystem::is_directory(grammars_dir())) {
    for (const auto &entry : std::filesystem::directory_iterator(grammars_dir())) {
      if (entry.path().extension() == ".gbnf") seeds.push_back(read_file(entry.path()));
    }
  }
  GbnfOptions options;
  options.special_token = [](std::string_view ref) -> std::optional<int32_t> {
    return ref.size() % 2 ? std::optional<int32_t>(7) : std::nullopt;
  };
  int parsed = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string text;
    if (round % 3 == 0) {
      const size_t n = gen() % 200;
      for (size_t i = 0; i < n; ++i) text += alphabet[gen() % alphabet.size()];
    } else {
      text = seeds[gen() % seeds.size()];
      for (int edits = 1 + int(gen() % 4); edits > 0 && !text.empty(); --edits) {
        const size_t at = gen() % text.size();
        switch (gen() % 3) {
        case 0:
          text.erase(at, 1 + gen() % 3);
          break;
        case 1:
          text.insert(at, 1, alphabet[gen() % alphabet.size()]);
          break;
        default:
          text[at] = alphabet[gen() % alphabet.size()];
        }
      }
    }
    auto g = parse_gbnf(text, options);
    if (g.ok()) {
      ++parsed;
      EXPECT_TRUE(validate_grammar(*g).ok());
    } else {
      EXPECT_EQ(g.message().rfind("gbnf", 0), 0u) << g.message();
    }
  }
  EXPECT_GT(parsed, 100); // the edits leave many grammars valid
}

} // namespace
} // namespace offgraph::sample
