// Helpers of the engine tests: a small generated Muse Glimmer model (window 16), options whose
// rings wrap within every prompt, greedy requests, and running requests to completion.
#pragma once

#include "engine/engine.h"
#include "sample/grammar.h"
#include "sample/grammar_matcher.h"
#include "synth/synth.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <unistd.h>

namespace offgraph::engine::testing {

namespace fs = std::filesystem;

struct Fixture {
  std::string path;
  std::unique_ptr<model::Model> model;
  Fixture() {
    path = (fs::temp_directory_path() /
            ("offgraph-engine-test-" + std::to_string(::getpid()) + ".gguf"))
               .string();
    synth::SynthSpec s = synth::preset("tiny", "muse-glimmer").value();
    s.n_layer = 4, s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 96,
    s.window = 16;
    s.n_vocab = 500, s.seed = 9;
    EXPECT_TRUE(synth::write_model(s, path).ok());
    model = std::move(model::Model::load(path)).value();
  }
  ~Fixture() { fs::remove(path); }
};

inline Fixture &fixture() {
  static Fixture f;
  return f;
}

inline EngineOptions options(int32_t max_cached) {
  EngineOptions o;
  o.context = 256;
  o.max_write = 8; // rings of 16 + 8 - 1 rows: they wrap within every prompt here
  o.step_tokens = 20;
  o.max_active = 4;
  o.max_cached = max_cached;
  o.types = {GGML_TYPE_F32, GGML_TYPE_F32};
  return o;
}

inline Request greedy(std::vector<int32_t> prompt, int32_t n) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = n;
  return r;
}

inline std::vector<int32_t> random_tokens(std::mt19937_64 &rng, size_t n) {
  std::vector<int32_t> t(n);
  for (int32_t &x : t) x = std::uniform_int_distribution<int32_t>(0, 499)(rng);
  return t;
}

// Runs requests to completion on `engine`, returning each one's tokens in submission order.
inline std::vector<std::vector<int32_t>> run(Engine &engine, const std::vector<Request> &requests) {
  std::vector<std::vector<int32_t>> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = engine.submit(requests[i], [&out, i](const Event &e) {
      if (e.token >= 0) out[i].push_back(e.token);
      EXPECT_NE(e.finish, FinishReason::Error) << e.error;
    });
    EXPECT_TRUE(id.ok()) << id.message();
  }
  engine.run_until_idle();
  return out;
}

// Embedding rows standing for an encoded image: n_rows rows of the model's width, N(0, 1).
inline std::shared_ptr<const model::EncodedImage> random_image(uint64_t seed, int32_t n_rows) {
  auto img = std::make_shared<model::EncodedImage>();
  img->n_rows = n_rows, img->width = fixture().model->config().n_embd;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  img->rows.resize(size_t(n_rows) * size_t(img->width));
  for (float &x : img->rows) x = d(rng);
  return img;
}

// A grammar of calls over the fixture's vocabulary, token i spelled "<i>", token 2 the end:
// root ::= call ("<3>" call)* ; call ::= "<7>" ("<8><9>" | "<10>").
struct CallsGrammar {
  std::shared_ptr<sample::TokenTexts> texts;
  sample::Grammar grammar;
  std::shared_ptr<const sample::CompiledGrammar> compiled;
};
inline CallsGrammar calls_grammar() {
  CallsGrammar c;
  c.texts = std::make_shared<sample::TokenTexts>();
  for (int i = 0; i < 500; ++i) c.texts->bytes.push_back("<" + std::to_string(i) + ">");
  c.texts->special.assign(500, 0);
  c.texts->special[2] = 1; // the end token
  sample::GrammarBuilder g;
  const sample::Element tail = g.choice("tail", {g.literal("<8><9>"), g.literal("<10>")});
  sample::Sequence one = g.literal("<7>");
  one.push_back(tail);
  sample::Sequence again = g.literal("<3>");
  again.insert(again.end(), one.begin(), one.end());
  one.push_back(*g.repeat("more", again, 0, sample::kUnbounded));
  const sample::Element root = g.rule("root", {one});
  auto grammar = std::move(g).finish(root.value);
  EXPECT_TRUE(grammar.ok()) << grammar.message();
  c.grammar = *grammar;
  auto compiled =
      sample::compile_grammar(*grammar, std::make_shared<sample::GrammarVocabulary>(c.texts), {2});
  EXPECT_TRUE(compiled.ok()) << compiled.message();
  c.compiled = *compiled;
  return c;
}

inline std::vector<int32_t> alone(const Request &r) {
  auto e = Engine::create(*fixture().model, options(0));
  return run(**e, {r})[0];
}

// Each choice's tokens of `r` run alone on a fresh engine (none may error).
inline std::vector<std::vector<int32_t>> choices_alone(const Request &r) {
  auto e = Engine::create(*fixture().model, options(0));
  std::vector<std::vector<int32_t>> out(size_t(r.n));
  EXPECT_TRUE((*e)->submit(r,
                           [&](const Event &ev) {
                             EXPECT_NE(ev.finish, FinishReason::Error) << ev.error;
                             if (ev.token >= 0) out[size_t(ev.choice)].push_back(ev.token);
                           })
                  .ok());
  (*e)->run_until_idle();
  return out;
}

} // namespace offgraph::engine::testing
