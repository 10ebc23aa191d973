// The OpenAI-compatible HTTP server: JSON and SSE in front of the engine. One engine thread runs
// the step loop; HTTP handler threads submit requests and wait for their events. No ggml here.
#pragma once

#include "base/status.h"
#include "engine/engine.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace httplib {
class Server;
}

namespace offgraph::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080; // 0: any free port (see port())
  std::string model_name;
  size_t max_body_bytes = size_t(8) << 20;
};

class Server {
public:
  static Result<std::unique_ptr<Server>>
  create(const model::Model &model, engine::EngineOptions engine_options, ServerOptions options);
  ~Server();

  // Binds and serves in background threads; returns once listening.
  Status start();
  int port() const { return port_; }
  void stop();
  // Blocks until stop() (for `offgraph serve`).
  void wait();

private:
  Server() = default;
  void engine_loop();
  void routes();

  const model::Model *model_ = nullptr;
  ServerOptions options_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::optional<text::Template> template_;
  bool atem_ = false;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_, engine_thread_;
  int port_ = 0;

  // The engine is single-threaded: handlers hand it work under this lock and wake it.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<bool> stopping_{false};
  struct {
    std::atomic<int64_t> requests{0}, rejected{0};
  } metrics_;

  friend struct Handlers;
};

} // namespace offgraph::server
