// Request JSON to engine parameters: the server's own parsing (server/api.h: parse_body, then
// parse_request for /v1/chat/completions or /v1/completions; server/anthropic.h for
// /v1/messages and /v1/messages/count_tokens: mode bits 1 and 2; server/responses.h for
// /v1/responses: mode bit 3, with a store of two) on arbitrary bodies, with the Muse
// Glimmer vocabulary and template. Properties: no crash or hang; a refusal has a message, an HTTP
// status in 400..599 and an error body that serializes; an accepted request is one the engine
// can run as is: prompt ids in the vocabulary, 1 <= max_tokens, prompt + max_tokens within the
// context, 1 <= n <= 16, sampling parameters that validate, stop tokens in the vocabulary.
#include "fuzz_util.h"
#include "muse_fixture.h"

#include "sample/sampler.h"
#include "server/anthropic.h"
#include "server/api.h"
#include "server/responses.h"
#include "text/atem/atem_grammar.h"

#include "ggml.h"

using namespace offgraph;

namespace {

struct Fixture {
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::optional<text::Template> muse;
  server::ModelFacts facts;
};

Fixture &fixture() {
  static Fixture f;
  return f;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  ggml_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
  Fixture &f = fixture();
  f.tokenizer = fuzz::muse_tokenizer();
  f.muse = fuzz::muse_template();
  f.facts.tokenizer = f.tokenizer.get();
  f.facts.chat_template = &*f.muse;
  f.facts.format = text::ChatFormat::kAtem;
  f.facts.arch = "muse-glimmer";
  f.facts.n_vocab = f.tokenizer->n_vocab();
  f.facts.context = 4096;
  f.facts.max_tokens_cap = 2048;
  f.facts.model_names = {"offgraph", "muse-glimmer"};
  f.facts.vocabulary =
      std::make_shared<sample::GrammarVocabulary>(text::grammar_token_texts(*f.tokenizer));
  f.facts.grammars = std::make_shared<server::GrammarCache>(8);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const Fixture &f = fixture();
  fuzz::Input in(data, size);
  const uint8_t mode = in.byte();
  const bool chat = !(mode & 1), anthropic = mode & 2, count_only = mode & 4, responses = mode & 8;
  const std::string text = in.rest();

  auto refused = [](const server::ApiError &e) {
    FUZZ_CHECK(!e.message.empty(), "a refusal without a message");
    FUZZ_CHECK(e.status >= 400 && e.status < 600, "status %d", e.status);
    (void)server::error_body(e).dump(-1, ' ', false, server::json::error_handler_t::replace);
  };
  server::json body;
  std::optional<server::ApiError> bad_body = server::parse_body(text, body);
  if (bad_body) {
    refused(*bad_body);
    return 0;
  }
  server::Job job;
  static server::responses::Store store(2);
  server::responses::Request meta;
  const server::responses::Options options{&store, bool(mode & 16)};
  std::optional<server::ApiError> bad_request =
      responses    ? server::responses::parse(body, f.facts, options, job, meta)
      : !anthropic ? server::parse_request(body, chat, f.facts, job)
      : count_only ? server::anthropic::parse_count_tokens(body, f.facts, job)
                   : server::anthropic::parse_messages(body, f.facts, job);
  if (bad_request) {
    refused(*bad_request);
    (void)server::anthropic::error_body(*bad_request)
        .dump(-1, ' ', false, server::json::error_handler_t::replace);
    return 0;
  }
  if (responses && meta.store) { // what a later request's previous_response_id continues
    server::responses::Stored kept;
    kept.input = meta.input;
    store.put("resp_fuzz", kept);
  }
  if (anthropic && count_only && !responses) {
    FUZZ_CHECK(!job.request.prompt.empty(), "an empty prompt was counted");
    FUZZ_CHECK(int64_t(job.request.prompt.size()) < f.facts.context, "a count over the context");
    return 0;
  }
  const engine::Request &r = job.request;
  FUZZ_CHECK(!r.prompt.empty(), "an empty prompt was accepted");
  for (int32_t id : r.prompt)
    FUZZ_CHECK(id >= 0 && id < f.facts.n_vocab, "prompt id %d outside the vocabulary", int(id));
  FUZZ_CHECK(r.max_tokens >= 1, "max_tokens %d", int(r.max_tokens));
  FUZZ_CHECK(int64_t(r.prompt.size()) + r.max_tokens <= f.facts.context,
             "prompt %zu + max_tokens %d exceed the context", r.prompt.size(), int(r.max_tokens));
  FUZZ_CHECK(r.n >= 1 && r.n <= 16, "n = %d", int(r.n));
  const Status v = sample::validate(r.sampling, f.facts.n_vocab);
  FUZZ_CHECK(v.ok(), "accepted sampling parameters do not validate: %s", v.message().c_str());
  for (int32_t id : r.stop_tokens)
    FUZZ_CHECK(id >= 0 && id < f.facts.n_vocab, "stop token %d", int(id));
  for (const auto &s : job.stop_strings) FUZZ_CHECK(!s.empty(), "an empty stop string");
  return 0;
}
