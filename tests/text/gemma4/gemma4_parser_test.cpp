// Gemma4Parser against its independent reference, the pinned tree's Gemma 4 template (rendered
// byte for byte like Jinja2, tests/text/template): every call the template writes into a history
// reads back as the arguments it was given, streamed in any split; reasoning, content and the
// end of the turn come apart as the template puts them together.
#include "text/gemma4/gemma4_parser.h"

#include "text/chat/chat_format.h"
#include "text/template/chat_template.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace offgraph::text {
namespace {

using ojson = nlohmann::ordered_json;

std::string read(const std::string &path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string &gemma4_template() {
  static const std::string s =
      read(std::string(OFFGRAPH_TEMPLATE_FIXTURES) + "/google-gemma-4-31B-it.jinja");
  return s;
}

// What the template writes for an assistant turn holding `calls` (after the generation prompt):
// the text a model trained on it writes.
std::string rendered_calls(const ojson &calls) {
  ojson ctx = {{"bos_token", ""},
               {"messages", ojson::array({{{"role", "user"}, {"content", "go"}},
                                          {{"role", "assistant"}, {"tool_calls", calls}}})}};
  auto out = render_chat_template(gemma4_template(), ctx);
  EXPECT_TRUE(out.ok()) << out.message();
  const std::string prefix = "<|turn>model\n";
  const size_t at = out->find(prefix);
  EXPECT_NE(at, std::string::npos);
  return out->substr(at + prefix.size());
}

ChatMessage streamed(std::string_view text, const std::vector<size_t> &cuts,
                     std::vector<ChatEvent> *events = nullptr) {
  Gemma4Parser p;
  size_t from = 0;
  auto take = [&](std::vector<ChatEvent> e) {
    if (events) events->insert(events->end(), e.begin(), e.end());
  };
  for (size_t cut : cuts) {
    take(p.feed(text.substr(from, cut - from)));
    from = cut;
  }
  take(p.feed(text.substr(from)));
  take(p.finish());
  return p.message();
}

void expect_same(const ChatMessage &a, const ChatMessage &b, const std::string &what) {
  EXPECT_EQ(a.reasoning_content, b.reasoning_content) << what;
  EXPECT_EQ(a.content, b.content) << what;
  EXPECT_EQ(a.ended, b.ended) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
  }
}

// A random argument value of every kind the template writes (fixed seed; no value is empty of
// meaning: strings hold quotes, braces, colons, commas, newlines and non-ASCII text).
ojson random_value(std::mt19937 &rng, int depth) {
  const int kind = int(rng() % (depth > 2 ? 5 : 7));
  static const std::vector<std::string> words = {
      "Zürich", "a, b",      "x:y",          "{brace}", "[1,2]", "line\none", "say \"hi\"",
      "<b>",    "a<turn|>b", "<tool_call|>", "  pad  ", "None",  "true",      "42"};
  switch (kind) {
  case 0:
    return words[rng() % words.size()];
  case 1:
    return int64_t(rng() % 2001) - 1000;
  case 2:
    return double(int64_t(rng() % 20001) - 10000) / 64.0;
  case 3:
    return (rng() & 1) != 0;
  case 4:
    return nullptr;
  case 5: {
    ojson list = ojson::array();
    for (size_t n = rng() % 4; n > 0; --n) list.push_back(random_value(rng, depth + 1));
    return list;
  }
  default: {
    ojson map = ojson::object();
    for (size_t n = rng() % 4; n > 0; --n)
      map["k" + std::to_string(rng() % 50)] = random_value(rng, depth + 1);
    return map;
  }
  }
}

TEST(Gemma4Parser, ReadsBackEveryCallTheTemplateWrites) {
  std::mt19937 rng(35);
  for (int round = 0; round < 300; ++round) {
    ojson calls = ojson::array();
    const size_t n = 1 + rng() % 3;
    for (size_t i = 0; i < n; ++i) {
      ojson args = ojson::object();
      for (size_t k = rng() % 5; k > 0; --k)
        args["arg_" + std::to_string(rng() % 20)] = random_value(rng, 0);
      calls.push_back(
          {{"id", "call_" + std::to_string(i)},
           {"type", "function"},
           {"function",
            {{"name", i % 2 ? "weather.get_forecast" : "search"}, {"arguments", args}}}});
    }
    const std::string text = rendered_calls(calls);
    ASSERT_NE(text.find("<|tool_call>call:"), std::string::npos) << text;
    const ChatMessage m = parse_gemma4(text);
    ASSERT_EQ(m.tool_calls.size(), n) << text;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(m.tool_calls[i].name, calls[i]["function"]["name"]) << text;
      // JSON equality (objects compare by key, as dictsort reorders them).
      EXPECT_EQ(m.tool_calls[i].arguments,
                nlohmann::json::parse(calls[i]["function"]["arguments"].dump()))
          << text;
    }
    EXPECT_EQ(m.content, "") << text;
    EXPECT_TRUE(m.ended) << text; // the template ends a pending call with <|tool_response>
  }
}

TEST(Gemma4Parser, SplitsReasoningContentAndTheEnd) {
  const std::string text = "<|channel>thought\nThe user wants weather.\nCheck Zürich.\n<channel|>"
                           "It is sunny, 21 °C.<turn|>";
  const ChatMessage m = parse_gemma4(text);
  EXPECT_EQ(m.reasoning_content, "The user wants weather.\nCheck Zürich.");
  EXPECT_EQ(m.content, "It is sunny, 21 °C.");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_TRUE(m.ended);
  // What the template writes back into the history from this message: the thinking stripped.
  ojson ctx = {{"bos_token", ""},
               {"messages", ojson::array({{{"role", "user"}, {"content", "weather?"}},
                                          {{"role", "assistant"}, {"content", text}}})}};
  auto history = render_chat_template(gemma4_template(), ctx);
  ASSERT_TRUE(history.ok()) << history.message();
  EXPECT_NE(history->find("<|turn>model\n" + m.content), std::string::npos) << *history;
}

TEST(Gemma4Parser, AnySplitGivesTheSameMessageAndNoPartialMarker) {
  const std::string text =
      "<|channel>thought\nPlan: call the tool.\n\n<channel|>Let me look <that> up."
      "<|tool_call>call:search{max_results:5,query:<|\"|>föhn <wind>: <turn|>?<|\"|>}<tool_call|>"
      "<|tool_call>call:weather.get_forecast{days:3,location:<|\"|>Bern<|\"|>}<tool_call|>"
      "<|tool_response>";
  const ChatMessage whole = parse_gemma4(text);
  EXPECT_EQ(whole.reasoning_content, "Plan: call the tool.\n");
  EXPECT_EQ(whole.content, "Let me look <that> up.");
  ASSERT_EQ(whole.tool_calls.size(), 2u);
  EXPECT_EQ(whole.tool_calls[0].arguments.dump(),
            R"({"max_results":5,"query":"föhn <wind>: <turn|>?"})");
  // Every two-way split, and byte by byte: the same message, and the deltas add up to it (a delta
  // never takes back text, so none held a piece of a marker that later turned out one).
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  std::vector<std::vector<size_t>> splits = {bytes};
  for (size_t i = 1; i < text.size(); ++i) splits.push_back({i});
  for (const auto &cuts : splits) {
    std::vector<ChatEvent> events;
    const ChatMessage m = streamed(text, cuts, &events);
    expect_same(m, whole, "cuts at " + std::to_string(cuts.front()));
    std::string reasoning, content;
    for (const auto &e : events) {
      if (e.kind == ChatEvent::Kind::Reasoning) reasoning += e.text;
      if (e.kind == ChatEvent::Kind::Content) content += e.text;
    }
    EXPECT_EQ(reasoning, whole.reasoning_content);
    EXPECT_EQ(content, whole.content);
  }
}

TEST(Gemma4Parser, IsLenientWhereModelsAreSloppyAndKeepsWhatItCannotRead) {
  // An empty thought channel (the prompt's own, when thinking is off) and a stray <channel|>.
  ChatMessage m = parse_gemma4("<|channel>thought\n<channel|>Hi.<channel|><turn|>");
  EXPECT_EQ(m.reasoning_content, "");
  EXPECT_EQ(m.content, "Hi.");
  // A call the model wrote badly stays visible as content, never a guessed call.
  m = parse_gemma4("<|tool_call>call:search{query:<|\"|>x}<tool_call|><turn|>");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "<|tool_call>call:search{query:<|\"|>x}<tool_call|>");
  // A call cut off by the end of the stream is left out; text after the turn's end is not read.
  m = parse_gemma4("Sure.<|tool_call>call:search{query:<|\"|>x");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "Sure.");
  EXPECT_FALSE(m.ended);
  m = parse_gemma4("Done.<turn|>more");
  EXPECT_EQ(m.content, "Done.");
  // Python's spellings (the template prints None as None) and quoted keys read as JSON's.
  auto call = parse_gemma4_call("call:f{<|\"|>a b<|\"|>:None,c:True,d:-1.5e3,e:[ ],f:{ }}");
  ASSERT_TRUE(call.ok()) << call.message();
  EXPECT_EQ(call->arguments.dump(), R"({"a b":null,"c":true,"d":-1500.0,"e":[],"f":{}})");
  // Refusals name the problem.
  EXPECT_FALSE(parse_gemma4_call("search{q:1}").ok());
  EXPECT_FALSE(parse_gemma4_call("call:{q:1}").ok());
  EXPECT_FALSE(parse_gemma4_call("call:f{q:1} extra").ok());
  std::string deep = "call:f{a:" + std::string(70, '[') + std::string(70, ']') + "}";
  auto too_deep = parse_gemma4_call(deep);
  ASSERT_FALSE(too_deep.ok());
  EXPECT_NE(too_deep.message().find("64 levels"), std::string::npos) << too_deep.message();
}

TEST(ChatFormat, EachTemplateOfThePinnedTreeSpeaksOneFormat) {
  const std::filesystem::path dir = std::string(OFFGRAPH_LLAMA_TREE) + "/models/templates";
  std::vector<std::string> atem, gemma4;
  size_t templates = 0;
  for (const auto &entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".jinja") continue;
    ++templates;
    const ChatFormat f = detect_chat_format(read(entry.path().string()));
    if (f == ChatFormat::kAtem) atem.push_back(entry.path().filename());
    if (f == ChatFormat::kGemma4) gemma4.push_back(entry.path().filename());
  }
  std::sort(gemma4.begin(), gemma4.end());
  EXPECT_GT(templates, 50u);
  EXPECT_EQ(atem, std::vector<std::string>{"muse-glimmer.jinja"});
  EXPECT_EQ(gemma4, (std::vector<std::string>{"google-gemma-4-31B-it-interleaved.jinja",
                                              "google-gemma-4-31B-it.jinja"}));
  // One ATEM marker alone is not enough.
  EXPECT_EQ(detect_chat_format("{{ '<|eom|>' }}"), ChatFormat::kPlain);
  EXPECT_EQ(detect_chat_format("{{ '<atem:function_calls>' }}{{ '<|eom|>' }}"), ChatFormat::kAtem);
  // The pinned template reads role:tool messages itself; the interleaved variant does not.
  EXPECT_TRUE(reads_tool_messages(gemma4_template()));
  EXPECT_FALSE(reads_tool_messages(
      read(std::string(OFFGRAPH_TEMPLATE_FIXTURES) + "/google-gemma-4-31B-it-interleaved.jinja")));
}

// The interleaved template reads results only from tool_responses: folded, an OpenAI history
// renders what the pinned template renders from the same results given natively.
TEST(ChatFormat, FoldedToolResultsRenderAsTheNativeField) {
  const ojson call = {{"id", "c1"},
                      {"type", "function"},
                      {"function", {{"name", "search"}, {"arguments", {{"query", "föhn"}}}}}};
  ojson openai = ojson::array(
      {{{"role", "user"}, {"content", "föhn?"}},
       {{"role", "assistant"}, {"content", ""}, {"tool_calls", {call}}},
       {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "{\"hits\": 3, \"top\": \"wind\"}"}},
       {{"role", "assistant"}, {"content", "A warm wind."}},
       {{"role", "user"}, {"content", "thanks"}}});
  ojson native = ojson::array(
      {openai[0],
       {{"role", "assistant"},
        {"tool_calls", {call}},
        {"tool_responses", {{{"name", "search"}, {"response", {{"hits", 3}, {"top", "wind"}}}}}},
        {"content", "A warm wind."}},
       openai[4]});
  ojson folded = openai;
  fold_tool_results(folded);
  EXPECT_EQ(nlohmann::json::parse(folded.dump()), nlohmann::json::parse(native.dump()));
  const std::string interleaved =
      read(std::string(OFFGRAPH_TEMPLATE_FIXTURES) + "/google-gemma-4-31B-it-interleaved.jinja");
  ojson a = {{"bos_token", "<bos>"}, {"messages", folded}, {"add_generation_prompt", true}};
  ojson b = {{"bos_token", "<bos>"}, {"messages", native}, {"add_generation_prompt", true}};
  auto ra = render_chat_template(interleaved, a), rb = render_chat_template(interleaved, b);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(*ra, *rb);
  EXPECT_NE(ra->find("<|tool_response>response:search{hits:3,top:<|\"|>wind<|\"|>}"),
            std::string::npos)
      << *ra;
}

} // namespace
} // namespace offgraph::text

namespace offgraph::text {
namespace {

// A history whose calls' message had text of its own ends in "<turn|>\n" after the results, with
// no generation prompt from the template: the format opens the model's turn (as llama.cpp does).
TEST(ChatFormat, Gemma4OpensTheTurnTheTemplateLeftClosed) {
  const ojson call = {{"id", "c1"},
                      {"type", "function"},
                      {"function", {{"name", "search"}, {"arguments", {{"q", "x"}}}}}};
  for (bool thinking : {false, true}) {
    ojson ctx = {
        {"bos_token", "<bos>"},
        {"add_generation_prompt", true},
        {"messages",
         ojson::array(
             {{{"role", "user"}, {"content", "find x"}},
              {{"role", "assistant"}, {"content", "Let me check."}, {"tool_calls", {call}}},
              {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "found"}}})}};
    set_reasoning(ChatFormat::kGemma4, thinking ? "high" : "none", ctx);
    auto r = render_chat_template(gemma4_template(), ctx);
    ASSERT_TRUE(r.ok()) << r.message();
    ASSERT_EQ(r->substr(r->size() - 8), "<turn|>\n") << *r;
    EXPECT_EQ(missing_generation_prompt(ChatFormat::kGemma4, *r, ctx),
              thinking ? "<|turn>model\n" : "<|turn>model\n<|channel>thought\n<channel|>");
    EXPECT_EQ(missing_generation_prompt(ChatFormat::kPlain, *r, ctx), "");
  }
  // A prompt the template completed itself gets nothing more.
  ojson ctx = {{"bos_token", "<bos>"},
               {"add_generation_prompt", true},
               {"messages", ojson::array({{{"role", "user"}, {"content", "hi"}}})}};
  auto r = render_chat_template(gemma4_template(), ctx);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(missing_generation_prompt(ChatFormat::kGemma4, *r, ctx), "");
}

// enable_thinking is Gemma 4's switch; other templates get it only to turn thinking off (many
// read an undefined one as off).
TEST(ChatFormat, ReasoningVariables) {
  ojson a, b, c;
  set_reasoning(ChatFormat::kGemma4, "high", a);
  EXPECT_EQ(a["enable_thinking"], true);
  set_reasoning(ChatFormat::kPlain, "high", b);
  EXPECT_FALSE(b.contains("enable_thinking"));
  EXPECT_EQ(b["reasoning_strength"], "high");
  set_reasoning(ChatFormat::kPlain, "minimal", c);
  EXPECT_EQ(c["enable_thinking"], false);
  EXPECT_EQ(c["reasoning_strength"], "low");
}

} // namespace
} // namespace offgraph::text
