// A generated Muse Glimmer model (the real vocabulary and chat template embedded) behind an
// in-process server on a free loopback port, with a real HTTP client.
#pragma once

#include "server/server.h"
#include "synth/synth.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
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
