// Hostile clients and bounded load on 127.0.0.1: slow and idle connections, hang-ups at every
// phase of a request, invalid UTF-8, and a soak of concurrent clients with cancellations. After
// each, every accepted request was answered or cancelled, no sequence is left behind, and the
// server serves the next request.
#include "live_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <random>
#include <thread>

namespace offgraph::server::testing {
namespace {

struct Shared {
  std::string path = make_model(16, 13, "hostile");
  std::unique_ptr<model::Model> model = std::move(model::Model::load(path)).value();
  ~Shared() { fs::remove(path); }
};
Shared &shared() {
  static Shared s;
  return s;
}

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string http_request(const std::string &route, const std::string &body) {
  return "POST " + route + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Hang-ups at every phase (Chat Completions, Messages and Responses alike): before sending, inside
// the headers, before the body, inside the body,
// after the request (waiting for a whole answer), inside a stream. None leaves a sequence behind.
TEST(Hostile, HangUpsAtEveryPhase) {
  engine::EngineOptions eo = small_engine(2048, 32);
  eo.max_cached = 0;
  ServerOptions so = opts("hangups");
  so.read_timeout_seconds = 2;
  Running run(*shared().model, eo, so);
  // A random model may end its turn at any step; forbid the end tokens so that only the hang-up
  // can end these requests early.
  json whole = chat(1500, "Tell me everything");
  whole["logit_bias"] = no_end_tokens(shared().path);
  json streamed = whole;
  streamed["stream"] = true;
  const std::string full = http_request("/v1/chat/completions", whole.dump());
  struct Phase {
    std::string name, bytes;
    bool accepted; // the server read a whole request
  };
  std::vector<Phase> phases = {
      {"connect only", "", false},
      {"inside the headers", full.substr(0, 20), false},
      {"before the body", full.substr(0, full.find("\r\n\r\n") + 4), false},
      {"inside the body", full.substr(0, full.size() - 10), false},
      {"waiting for the answer", full, true},
      {"inside a stream", http_request("/v1/chat/completions", streamed.dump()), true},
  };
  // The agents' APIs alike, waiting and streaming. Greedy (they take no logit_bias): this model
  // does not end its turn within the 1500 tokens, the same every run.
  json anthropic = {{"model", "hangups"},
                    {"max_tokens", 1500},
                    {"temperature", 0},
                    {"messages", {{{"role", "user"}, {"content", "Tell me everything"}}}}};
  json responses = {{"model", "hangups"},
                    {"max_output_tokens", 1500},
                    {"temperature", 0},
                    {"input", "Tell me everything"}};
  for (bool stream : {false, true}) {
    anthropic["stream"] = stream, responses["stream"] = stream;
    const std::string how = stream ? "inside a stream" : "waiting for the answer";
    phases.push_back({"messages, " + how, http_request("/v1/messages", anthropic.dump()), true});
    phases.push_back({"responses, " + how, http_request("/v1/responses", responses.dump()), true});
  }
  double accepted = 0;
  for (const Phase &phase : phases) {
    const int fd = connect_to(run.server->port());
    ASSERT_GE(fd, 0);
    if (!phase.bytes.empty()) {
      ASSERT_EQ(send(fd, phase.bytes.data(), phase.bytes.size(), MSG_NOSIGNAL),
                ssize_t(phase.bytes.size()));
    }
    if (phase.accepted) {
      // Hang up only once the request is being generated: a token has come out.
      const double before = run.metric("offgraph_generated_tokens_total");
      for (int i = 0; i < 400 && run.metric("offgraph_generated_tokens_total") <= before; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
      EXPECT_GT(run.metric("offgraph_generated_tokens_total"), before) << phase.name;
      accepted += 1;
    }
    close(fd);
    EXPECT_TRUE(quiescent(run, accepted)) << phase.name;
  }
  EXPECT_EQ(run.metric("offgraph_requests_total"), 6);
  EXPECT_EQ(run.metric("offgraph_requests_completed_total"), 0);
  EXPECT_EQ(run.metric("offgraph_client_disconnects_total"), 6); // the six that were accepted
  EXPECT_EQ(run.metric("offgraph_sequences_held"), 0);
  EXPECT_LT(run.metric("offgraph_generated_tokens_total"), 6 * 1500);
  EXPECT_EQ(run.post("/v1/chat/completions", chat(3)).first, 200);
}

// A client that trickles its request loses the connection after the read timeout; meanwhile, and
// with many idle connections open, other clients are served.
TEST(Hostile, SlowAndIdleConnectionsDoNotStarveOthers) {
  ServerOptions so = opts("slow");
  so.read_timeout_seconds = 2, so.idle_seconds = 2, so.http_threads = 16;
  Running run(*shared().model, small_engine(), so);
  const int slow = connect_to(run.server->port());
  ASSERT_GE(slow, 0);
  const std::string partial = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le";
  ASSERT_GT(send(slow, partial.data(), partial.size(), MSG_NOSIGNAL), 0);
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) // more than the 16 handler threads
    if (int fd = connect_to(run.server->port()); fd >= 0) idle.push_back(fd);
  EXPECT_EQ(idle.size(), 40u);
  httplib::Client c("127.0.0.1", run.server->port());
  c.set_read_timeout(60, 0);
  auto r = c.Post("/v1/chat/completions", chat(3).dump(), "application/json");
  ASSERT_TRUE(r); // served once the idle connections timed out, well before the client gave up
  EXPECT_EQ(r->status, 200);
  // The slow client's connection was closed by the server after the read timeout (perhaps with
  // a 4xx first): reading ends with end-of-stream, not with our own 10 s receive timeout.
  timeval tv{10, 0};
  setsockopt(slow, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string got;
  char buf[256];
  ssize_t n = 0;
  while ((n = recv(slow, buf, sizeof buf, 0)) > 0) got.append(buf, size_t(n));
  EXPECT_TRUE(n == 0 || errno == ECONNRESET) << "recv: " << n << " errno " << errno;
  EXPECT_TRUE(got.empty() || got.rfind("HTTP/1.1 4", 0) == 0) << got;
  close(slow);
  for (int fd : idle) close(fd);
}

// Bytes that are not UTF-8 inside a JSON string: a clear 400, not a crash or a mangled prompt.
TEST(Hostile, InvalidUtf8IsRefused) {
  Running run(*shared().model, small_engine(), opts("utf8"));
  for (const std::string &bad :
       {std::string("\xff\xfe"), std::string("\xc3"), std::string("\xed\xa0\x80")}) {
    const std::string body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a" + bad + "b\"}],\"max_tokens\":2}";
    auto r = run.client->Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_json");
  }
  EXPECT_EQ(run.post("/v1/chat/completions", chat(2)).first, 200);
}

// Soak: 8 concurrent clients, 12 requests each, of every kind (streamed or not, n = 2, stop
// strings, completions, some abandoned mid-way), against a small queue. Every request is
// accounted for (answered, refused up front with 429, or abandoned by its client), the metrics
// agree, and afterwards nothing is active, queued or leaked: the KV store holds only what the
// conversation cache may hold.
TEST(Hostile, SoakWithCancellationsLosesNothing) {
  engine::EngineOptions eo = small_engine(1024, 32);
  eo.max_active = 4, eo.max_queue = 6, eo.max_cached = 3;
  Running run(*shared().model, eo, opts("soak"));
  std::atomic<int> answered{0}, refused{0}, abandoned{0}, other{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c)
    clients.emplace_back([&, c] {
      std::mt19937 rng(uint32_t(100 + c));
      httplib::Client client("127.0.0.1", run.server->port());
      client.set_read_timeout(120, 0);
      for (int i = 0; i < 12; ++i) {
        const int kind = int(rng() % 6);
        json req = chat(4 + int(rng() % 24),
                        "client " + std::to_string(c) + " request " + std::to_string(i));
        if (kind == 1) req["stream"] = true;
        if (kind == 2) req["n"] = 2, req["temperature"] = 0.8, req["seed"] = i;
        if (kind == 3) req["stop"] = json::array({"e", "a"});
        if (kind == 5) { // abandoned: sent, then the connection is closed after a moment
          const int fd = connect_to(run.server->port());
          const std::string r = http_request("/v1/chat/completions", req.dump());
          (void)send(fd, r.data(), r.size(), MSG_NOSIGNAL);
          std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 200));
          close(fd);
          ++abandoned;
          continue;
        }
        const std::string route = kind == 4 ? "/v1/completions" : "/v1/chat/completions";
        if (kind == 4) req = {{"prompt", "Soak " + std::to_string(i)}, {"max_tokens", 8}};
        auto r = client.Post(route.c_str(), req.dump(), "application/json");
        if (r && r->status == 200)
          ++answered;
        else if (r && r->status == 429)
          ++refused;
        else
          ++other;
      }
    });
  for (auto &t : clients) t.join();
  EXPECT_EQ(answered + refused + abandoned, 8 * 12);
  EXPECT_EQ(other, 0);
  EXPECT_GT(answered, 0);
  // Abandoned requests may still be on their way through the server: wait until it has read all
  // 96 (each accepted or refused) and every accepted one has ended.
  bool settled = false;
  for (int i = 0; i < 600 && !settled; ++i) {
    const double in = run.metric("offgraph_requests_total");
    settled = in + run.metric("offgraph_requests_rejected_total") == 8 * 12 &&
              run.metric("offgraph_requests_completed_total") +
                      run.metric("offgraph_client_disconnects_total") ==
                  in &&
              run.metric("offgraph_sequences_active") == 0;
    if (!settled) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(settled);
  EXPECT_EQ(run.metric("offgraph_queue_depth"), 0);
  // The server's view: every request it read was accepted or refused; every accepted one was
  // answered in full or cancelled because its client went away.
  const double accepted = run.metric("offgraph_requests_total");
  const double rejected = run.metric("offgraph_requests_rejected_total");
  EXPECT_GE(rejected, double(refused));
  EXPECT_LE(rejected, double(refused + abandoned));
  EXPECT_GE(accepted, double(answered));
  EXPECT_EQ(accepted + rejected, 8.0 * 12);
  EXPECT_EQ(run.metric("offgraph_requests_completed_total") +
                run.metric("offgraph_client_disconnects_total"),
            accepted);
  EXPECT_LE(run.metric("offgraph_sequences_held"), 3); // the conversation cache, nothing more
  EXPECT_EQ(run.metric("offgraph_sequences_cached"), run.metric("offgraph_sequences_held"));
  std::printf("[ soak     ] %d answered, %d refused with 429, %d abandoned; %.0f accepted; "
              "%.0f generated tokens\n",
              answered.load(), refused.load(), abandoned.load(), accepted,
              run.metric("offgraph_generated_tokens_total"));
  EXPECT_EQ(run.post("/v1/chat/completions", chat(2)).first, 200);
}

} // namespace
} // namespace offgraph::server::testing
