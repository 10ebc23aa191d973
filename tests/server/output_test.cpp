// OpenAI's response shapes as pure functions (server/output.h), against the shapes OpenAI
// documents, without a server: answers assembled from the real llama-bpe tokens of ATEM turns.
#include "server/output.h"

#include <gtest/gtest.h>

namespace offgraph::server {
namespace {

using json = nlohmann::ordered_json;

const text::Tokenizer &tokenizer() {
  static std::unique_ptr<text::Tokenizer> t = [] {
    auto r = text::Tokenizer::from_gguf(std::string(OFFGRAPH_LLAMA_TREE) +
                                        "/models/ggml-vocab-llama-bpe.gguf");
    EXPECT_TRUE(r.ok()) << r.message();
    return std::move(r).value();
  }();
  return *t;
}

const json &tools() {
  static const json t = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}])");
  return t;
}

// Feeds `text` as the model would write it (the ATEM markers are text in this vocabulary), and
// gathers what streaming would send.
struct Fed {
  std::unique_ptr<ChoiceOutput> out;
  std::vector<json> parts;
};
Fed feed(const std::string &text, bool atem, std::vector<std::string> stops = {}) {
  Fed f{std::make_unique<ChoiceOutput>(tokenizer(),
                                       atem ? text::ChatFormat::kAtem : text::ChatFormat::kPlain,
                                       tools(), stops, tokenizer().end_of_generation_ids()),
        {}};
  for (int32_t id : tokenizer().encode(text, false, true)) {
    for (json &p : delta_parts(f.out->feed(id))) f.parts.push_back(std::move(p));
    if (f.out->stopped()) break;
  }
  for (json &p : delta_parts(f.out->finish())) f.parts.push_back(std::move(p));
  return f;
}

TEST(OutputShapes, ChatResponseIsOpenAisShape) {
  const Fed f = feed(" to=self<|message|>Think first.<|eom|><|start|>assistant to=user<|message|>"
                     "Hello there.<|eot|>",
                     true);
  const json choice = whole_choice(true, 0, *f.out, "", nullptr, finish_reason(*f.out, false));
  EXPECT_EQ(choice.dump(), R"({"index":0,"message":{"role":"assistant","content":"Hello there.",)"
                           R"("reasoning_content":"Think first."},"logprobs":null,)"
                           R"("finish_reason":"stop"})");
  const ResponseHead head{"chatcmpl-7", true, 1700000000, "muse"};
  const json body = response_body(head, json::array({choice}), usage_shape(12, 9, 4));
  EXPECT_EQ(body.dump(),
            R"({"id":"chatcmpl-7","object":"chat.completion","created":1700000000,"model":"muse",)"
            R"("choices":[)" +
                choice.dump() +
                R"(],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21,)"
                R"("prompt_tokens_details":{"cached_tokens":4}}})");
}

TEST(OutputShapes, ToolCallsAndTheirStreamedDeltas) {
  const Fed f = feed(" to=get_weather<|message|><atem:function_calls>\n<atem:invoke "
                     "name=\"get_weather\">\n<atem:parameter name=\"city\">Lyon</atem:parameter>\n"
                     "<atem:parameter name=\"days\">3</atem:parameter>\n</atem:invoke>\n"
                     "</atem:function_calls><|eot|>",
                     true);
  EXPECT_EQ(finish_reason(*f.out, false), "tool_calls");
  // Cut by max_tokens after its calls: a cut all the same (the answer may have gone on).
  EXPECT_EQ(finish_reason(*f.out, true), "length");
  EXPECT_EQ(f.out->tool_calls().dump(),
            R"([{"id":"call_0","type":"function","function":{"name":"get_weather",)"
            R"("arguments":"{\"city\":\"Lyon\",\"days\":3}"}}])");
  // Streamed: one delta with the call, with its index (OpenAI's streaming shape).
  std::vector<json> calls;
  for (const json &p : f.parts)
    if (p.contains("tool_calls")) calls.push_back(p["tool_calls"]);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0][0]["index"], 0);
  const ResponseHead head{"chatcmpl-8", true, 5, "m"};
  const json chunk = chunk_body(head, 1, json{{"tool_calls", calls[0]}}, nullptr, nullptr);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"].size(), 1u);
  EXPECT_EQ(chunk["choices"][0]["index"], 1);
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
}

// What streaming sends, put together, is the non-streaming message, for answers of every kind.
TEST(OutputShapes, StreamedPartsAddUpToTheWholeMessage) {
  for (const std::string text :
       {" to=user<|message|>Plain answer, with é and 日本.<|eot|>",
        " to=self<|message|>a<|eom|><|start|>assistant to=self<|message|>b<|eom|><|start|>"
        "assistant to=user<|message|>done<|eot|>",
        " to=get_weather<|message|><atem:function_calls>\n<atem:invoke name=\"get_weather\">\n"
        "<atem:parameter name=\"city\">Nice</atem:parameter>\n</atem:invoke>\n"
        "</atem:function_calls><|eom|><|start|>assistant to=get_weather<|message|>"
        "<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter "
        "name=\"city\">Oslo</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>",
        " to=user<|message|>cut in the mid"}) {
    const Fed f = feed(text, true);
    std::string reasoning, content;
    json calls = json::array();
    for (const json &p : f.parts) {
      ASSERT_EQ(p.size(), 1u) << p.dump(); // one kind per delta
      if (p.contains("reasoning_content")) reasoning += p["reasoning_content"].get<std::string>();
      if (p.contains("content")) content += p["content"].get<std::string>();
      if (p.contains("tool_calls")) {
        json c = p["tool_calls"][0];
        EXPECT_EQ(c["index"], calls.size());
        c.erase("index");
        calls.push_back(c);
      }
    }
    EXPECT_EQ(reasoning, f.out->reasoning()) << text;
    EXPECT_EQ(content, f.out->content()) << text;
    EXPECT_EQ(calls, f.out->tool_calls()) << text;
  }
}

TEST(OutputShapes, CompletionsCarryTextAndEcho) {
  const Fed f = feed("Once upon a time, the end. More", false, {"the end"});
  EXPECT_TRUE(f.out->stopped());
  EXPECT_EQ(f.out->content(), "Once upon a time, ");
  EXPECT_EQ(finish_reason(*f.out, true), "stop"); // a stop string wins over the length
  const json choice = whole_choice(false, 0, *f.out, "Prompt: ", nullptr, "stop");
  EXPECT_EQ(
      choice.dump(),
      R"({"index":0,"text":"Prompt: Once upon a time, ","logprobs":null,"finish_reason":"stop"})");
  const ResponseHead head{"cmpl-3", false, 9, "m"};
  EXPECT_EQ(chunk_body(head, 0, {{"content", "Once"}}, nullptr, nullptr).dump(),
            R"({"id":"cmpl-3","object":"text_completion","created":9,"model":"m",)"
            R"("choices":[{"index":0,"text":"Once","logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(usage_chunk(head, usage_shape(3, 2, 0)).dump(),
            R"({"id":"cmpl-3","object":"text_completion","created":9,"model":"m","choices":[],)"
            R"("usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,)"
            R"("prompt_tokens_details":{"cached_tokens":0}}})");
  const Fed cut = feed("no stop here", false);
  EXPECT_EQ(finish_reason(*cut.out, true), "length");
  EXPECT_EQ(finish_reason(*cut.out, false), "stop");
}

} // namespace
} // namespace offgraph::server

namespace offgraph::server {
namespace {

// A Gemma 4 answer from the real Gemma 4 vocabulary's tokens (<turn|> and <|tool_response> are
// control tokens, rendered for the parser; <|tool_call> and <|"|> are user-defined text): the
// thought goes to reasoning_content, the call to tool_calls with JSON arguments, and the
// finish reason is tool_calls.
TEST(OutputShapes, Gemma4AnswerSplitsIntoReasoningAndToolCalls) {
  auto tok = text::Tokenizer::from_gguf(std::string(OFFGRAPH_LLAMA_TREE) +
                                        "/models/ggml-vocab-gemma-4.gguf");
  ASSERT_TRUE(tok.ok()) << tok.message();
  const std::string text = "<|channel>thought\nNeed the forecast.\n<channel|>"
                           "<|tool_call>call:get_weather{city:<|\"|>Zürich <3<|\"|>,days:2}"
                           "<tool_call|><|tool_response>";
  ChoiceOutput out(**tok, text::ChatFormat::kGemma4, tools(), {}, (*tok)->end_of_generation_ids());
  std::vector<json> parts;
  const auto ids = (*tok)->encode(text, false, true);
  const auto eog = (*tok)->end_of_generation_ids();
  ASSERT_NE(std::find(eog.begin(), eog.end(), ids.back()), eog.end()); // <|tool_response>
  for (int32_t id : ids)
    for (json &p : delta_parts(out.feed(id))) parts.push_back(std::move(p));
  for (json &p : delta_parts(out.finish())) parts.push_back(std::move(p));
  EXPECT_EQ(out.reasoning(), "Need the forecast.");
  EXPECT_EQ(out.content(), "");
  EXPECT_EQ(out.tool_calls().dump(),
            R"([{"id":"call_0","type":"function","function":{"name":"get_weather",)"
            R"("arguments":"{\"city\":\"Zürich <3\",\"days\":2}"}}])");
  EXPECT_EQ(finish_reason(out, false), "tool_calls");
  std::string streamed;
  for (const json &p : parts)
    if (p.contains("reasoning_content")) streamed += p["reasoning_content"].get<std::string>();
  EXPECT_EQ(streamed, "Need the forecast.");
  // An end token the parser does not read (<eos>) is not text of the answer.
  ChoiceOutput plain_end(**tok, text::ChatFormat::kGemma4, tools(), {}, eog);
  auto end_ids = (*tok)->encode("Fine.", false, true);
  ASSERT_NE(std::find(eog.begin(), eog.end(), (*tok)->eos()), eog.end());
  end_ids.push_back((*tok)->eos());
  for (int32_t id : end_ids) plain_end.feed(id);
  plain_end.finish();
  EXPECT_EQ(plain_end.content(), "Fine.");
}

} // namespace
} // namespace offgraph::server
