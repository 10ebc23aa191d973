// The OpenAI-compatible HTTP server: JSON and SSE in front of the engine. One engine thread runs
// the step loop; HTTP handler threads submit requests and wait for their events. No ggml here.
#pragma once

#include "base/status.h"
#include "engine/engine.h"
#include "server/api.h"
#include "server/metrics.h"
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
  std::string api_key;           // non-empty: every route but /health wants "Bearer <key>"
  std::string cors_origin;       // non-empty: CORS headers for this origin ("*" for any)
  int timeout_seconds = 600;     // writing a response (a slow reader of a long stream)
  int read_timeout_seconds = 30; // reading a request: a client that trickles it loses the line
  int idle_seconds = 5;          // a keep-alive connection with no new request is closed
  int32_t max_tokens_cap = 0;    // the most one request may ask for; 0: the context
  int http_threads = 64;         // connections served at once (idle keep-alive ones included)
  std::vector<std::string> model_aliases; // more ids requests may name (the file name, ...)
  // On stop, how long a step may go on waiting for a device server before every server is given
  // up on (model::Devices::interrupt): one that froze would otherwise hold the shutdown for good.
  // 0 or less: never give up.
  int device_stop_grace_seconds = 10;
  int32_t max_images = 8; // image parts one request may hold
  // Grammar mask tables shared by every compiled grammar (sample::GrammarVocabulary), the least
  // recently used dropped past it.
  size_t grammar_table_bytes = size_t(256) << 20;
  // Responses kept for previous_response_id and GET /v1/responses/{id} (the least recently used
  // dropped first); 0: none, and `store: true` is refused.
  size_t responses_store = 64;
  // Hosted tools of the Responses API (web_search, ...) this server cannot run: refused, or with
  // this set left out and reported (X-Offgraph-Dropped-Tools, offgraph_dropped_tools_total).
  bool drop_hosted_tools = false;
};

// Images in (--mmproj): the encoder (not owned; it outlives the server) and the tokens an image
// part is written with. No encoder: image parts are refused.
struct ImageServing {
  engine::ImageEncoder *encoder = nullptr;
  engine::ImageMarkers markers;
};

// A request's events on their way from the engine thread to its HTTP handler (server.cpp).
class Channel;
namespace responses {
class Store;
}

class Server {
public:
  // A server for a loaded model.
  static Result<std::unique_ptr<Server>> create(const model::Model &model,
                                                engine::EngineOptions engine_options,
                                                ServerOptions options, ImageServing images = {});
  // A server that answers /health with 503 (and every other route with 503) until attach().
  static Result<std::unique_ptr<Server>> create_loading(ServerOptions options);
  Status attach(const model::Model &model, engine::EngineOptions engine_options,
                ImageServing images = {});
  ~Server();

  // Binds and serves in background threads; returns once listening.
  Status start();
  int port() const { return port_; }
  // Whether start() widened the kernel's queue of connections not yet accepted (connection.h);
  // the server serves either way.
  const Status &backlog_status() const { return backlog_status_; }
  // The attached engine (its options with budgets resolved: EngineOptions::kKvBudgetFromMemory).
  const engine::Engine &engine() const { return *engine_; }
  void stop();
  // Blocks until stop() (for `offgraph serve`).
  void wait();
  bool ready() const { return ready_; }

  // Prometheus text of every metric (what GET /metrics returns).
  std::string metrics_text();

private:
  Server() = default;
  void engine_loop();
  void routes();

  const model::Model *model_ = nullptr;
  Status backlog_status_;
  ServerOptions options_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::optional<text::Template> template_;
  ModelFacts facts_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_, engine_thread_;
  std::thread warm_thread_; // grammar mask tables made at attach (structured.h)
  int port_ = 0;
  std::atomic<bool> ready_{false};

  // The engine loop sleeps on wake_ (under mutex_) when idle; handlers hand work to the engine's
  // thread-safe inbox and wake it.
  std::mutex mutex_;
  std::condition_variable wake_;
  void wake_engine();
  std::atomic<bool> stopping_{false}, engine_done_{false};
  // Channels that received token events during the current step: the loop wakes their handlers
  // once the step is over, so that a verify span's tokens reach the client as one chunk.
  std::mutex stepped_mutex_;
  std::vector<std::shared_ptr<Channel>> stepped_;
  void wake_stepped();
  std::mutex published_mutex_;
  KvMetrics published_kv_; // as of the last step
  // Templates and the tokenizer are used by one handler at a time.
  std::mutex text_mutex_;
  HttpCounters counters_;
  std::unique_ptr<responses::Store> responses_store_;
  // Random per start, in answer ids (msg_, toolu_, resp_): ids of two runs never collide in a
  // conversation that outlives one.
  std::string boot_id_;

  friend struct Routes;
};

} // namespace offgraph::server
