// Helpers of the engine tests: a small generated Muse Glimmer model (window 16), options whose
// rings wrap within every prompt, greedy requests, and running requests to completion.
#pragma once

#include "engine/engine.h"
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

inline std::vector<int32_t> alone(const Request &r) {
  auto e = Engine::create(*fixture().model, options(0));
  return run(**e, {r})[0];
}

} // namespace offgraph::engine::testing
