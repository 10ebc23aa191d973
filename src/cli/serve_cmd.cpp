#include "commands.h"

#include "kv/storage_types.h"
#include "server/server.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace offgraph::cli {

namespace {
server::Server *running = nullptr;
void on_signal(int) {
  if (running) running->stop();
}
} // namespace

std::function<int()> add_serve(CLI::App &app) {
  struct Opts {
    std::string model, host = "127.0.0.1", ctk = "f16", ctv = "f16", name;
    int port = 8080, ctx = 8192, parallel = 4, batch = 256, threads = 2, cached = 8;
  };
  auto o = std::make_shared<Opts>();
  CLI::App *cmd = app.add_subcommand("serve", "an OpenAI-compatible HTTP server");
  cmd->add_option("-m,--model", o->model, "the GGUF model")->required();
  cmd->add_option("--host", o->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "port")->capture_default_str();
  cmd->add_option("-c,--ctx", o->ctx, "context per sequence")->capture_default_str();
  cmd->add_option("--parallel", o->parallel, "requests computed together")->capture_default_str();
  cmd->add_option("--cache-seqs", o->cached, "finished conversations kept for prefix reuse")
      ->capture_default_str();
  cmd->add_option("-b,--batch", o->batch, "prefill chunk (max_write)")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "threads")->capture_default_str();
  cmd->add_option("--ctk", o->ctk, "K cache type")->capture_default_str();
  cmd->add_option("--ctv", o->ctv, "V cache type")->capture_default_str();
  cmd->add_option("--alias", o->name, "model name in responses");
  return [o]() -> int {
    // ggml's OpenMP workers spin between graph nodes by default; in a server they would starve the
    // HTTP threads on a small machine (a first request took 4 s instead of 0.2 s on 2 cores).
    setenv("OMP_WAIT_POLICY", "passive", 0);
    auto fail = [](const std::string &m) {
      return std::fprintf(stderr, "offgraph serve: %s\n", m.c_str()), 1;
    };
    auto m = model::Model::load(o->model, [](uint64_t d, uint64_t t) {
      if (t > (256u << 20)) progress_bar("loading", d, t);
    });
    if (!m.ok()) return fail(m.message());
    auto ctk = kv::parse_storage_type(o->ctk), ctv = kv::parse_storage_type(o->ctv);
    if (!ctk.ok() || !ctv.ok()) return fail((ctk.ok() ? ctv : ctk).message());
    engine::EngineOptions eo;
    eo.context = o->ctx;
    eo.max_write = o->batch;
    eo.step_tokens = std::max(o->batch, 512);
    eo.max_active = o->parallel;
    eo.max_cached = o->cached;
    eo.types = {*ctk, *ctv};
    eo.threads = o->threads;
    auto s = server::Server::create(**m, eo, {o->host, o->port, o->name});
    if (!s.ok()) return fail(s.message());
    if (Status st = (*s)->start(); !st.ok()) return fail(st.message());
    std::fprintf(stderr, "offgraph serve: listening on http://%s:%d (model %s)\n", o->host.c_str(),
                 (*s)->port(), o->model.c_str());
    running = s->get();
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    (*s)->wait();
    (*s)->stop();
    return 0;
  };
}

} // namespace offgraph::cli
