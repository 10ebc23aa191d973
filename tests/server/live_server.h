// A generated Muse Glimmer model (the real vocabulary and chat template embedded) behind an
// in-process server on a free loopback port, with a real HTTP client.
#pragma once

#include "server/server.h"
#include "synth/synth.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <unistd.h>

namespace offgraph::server::testing {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline ServerOptions opts(const std::string &name) {
  ServerOptions o;
  o.host = "127.0.0.1", o.port = 0, o.model_name = name;
  return o;
}

// A model file of its own per test binary (and window), removed at exit.
inline std::string make_model(int window, uint64_t seed, const std::string &tag) {
  const std::string path =
      (fs::temp_directory_path() / ("offgraph-" + tag + "-" + std::to_string(::getpid()) + ".gguf"))
          .string();
  synth::SynthSpec s = synth::preset("tiny", "muse-glimmer").value();
  s.vocab_path = std::string(OFFGRAPH_LLAMA_TREE) + "/models/ggml-vocab-llama-bpe.gguf";
  s.template_path = std::string(OFFGRAPH_LLAMA_TREE) + "/models/templates/muse-glimmer.jinja";
  s.n_embd = 64, s.head_dim = 16, s.window = window, s.seed = seed;
  EXPECT_TRUE(synth::write_model(s, path).ok());
  return path;
}

inline engine::EngineOptions small_engine(int context = 512, int max_write = 32) {
  engine::EngineOptions eo;
  eo.context = context, eo.max_write = max_write, eo.max_active = 4, eo.max_cached = 4;
  eo.types = {GGML_TYPE_F32, GGML_TYPE_F32};
  return eo;
}

struct Running {
  std::unique_ptr<Server> server;
  std::unique_ptr<httplib::Client> client;
  Running(const model::Model &model, engine::EngineOptions eo, ServerOptions so) {
    server = std::move(Server::create(model, eo, so)).value();
    EXPECT_TRUE(server->start().ok());
    client = std::make_unique<httplib::Client>("127.0.0.1", server->port());
    client->set_read_timeout(120, 0);
  }
  ~Running() { server->stop(); }
  std::pair<int, json> post(const std::string &route, const json &body,
                            const httplib::Headers &headers = {}) {
    auto r = client->Post(route.c_str(), headers, body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  // A Prometheus sample without labels, or -1.
  double metric(const std::string &name, const httplib::Headers &headers = {}) {
    auto m = client->Get("/metrics", headers);
    if (!m) return -1;
    const size_t at = m->body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(m->body.substr(at + name.size() + 2));
  }
};

// Waits (bounded) until the server has accepted `accepted` requests and every one of them has
// ended (answered in full or cancelled because its client left) and nothing is active, queued or
// held. Looking only at "active" is not enough: a request the server has not read yet, or one
// whose first step has not been published, also shows 0 active.
inline bool quiescent(Running &run, double accepted) {
  for (int i = 0; i < 400; ++i) {
    const double in = run.metric("offgraph_requests_total");
    const double ended = run.metric("offgraph_requests_completed_total") +
                         run.metric("offgraph_client_disconnects_total");
    if (in == accepted && ended == accepted && run.metric("offgraph_sequences_active") == 0 &&
        run.metric("offgraph_queue_depth") == 0 && run.metric("offgraph_sequences_held") == 0)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// logit_bias that forbids the model's end-of-turn tokens: a random model may end its turn at any
// step, and tests of hang-ups need requests that only the hang-up can end early.
inline json no_end_tokens(const std::string &model_path) {
  json bias = json::object();
  auto tok = text::Tokenizer::from_gguf(model_path);
  EXPECT_TRUE(tok.ok()) << tok.message();
  if (tok.ok())
    for (int32_t id : (*tok)->end_of_generation_ids()) bias[std::to_string(id)] = -100;
  return bias;
}

inline json chat(int max_tokens, std::string user = "Hello there") {
  return {{"messages", {{{"role", "user"}, {"content", user}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

// The data lines of an SSE body, [DONE] included.
inline std::vector<std::string> sse_data(const std::string &body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

} // namespace offgraph::server::testing
