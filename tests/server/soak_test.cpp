// The server soak (issue 37; `make soak` runs it at OFFGRAPH_SOAK_REQUESTS, 20,000): 32 clients on
// loopback send a mix of long prompts, branches of a few conversations, n = 2, images, JSON
// schemas, n-gram speculation, logprobs and streams, and hang up on 15% of their requests, against
// a server with small budgets (KV, compute, image rows, image cache, cached conversations). Every
// request a client completed got 200 or a 429 (the queue full), never a 5xx or another 4xx; every
// request the server accepted was answered in full or cancelled because its client left; while it
// runs no budget in /metrics is ever past its limit; afterwards nothing is active or queued, the KV
// store holds only what the cached conversations hold, the image rows only what the image cache
// holds, and the process's resident memory is within 10% of what it was after the first tenth of
// the requests (at least 400, by when the caches are full).
#include "../image/random_png.h"
#include "engine/images.h"
#include "image_models.h"
#include "live_server.h"

#include <sys/socket.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>

namespace offgraph::server::testing {
namespace {

using Bytes = std::vector<uint8_t>;

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

// Sends `body` on a raw connection and closes it after `wait_ms`: a client that hangs up.
void hang_up(int port, const std::string &body, int wait_ms) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET, addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) == 0) {
    const std::string r = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
    (void)send(fd, r.data(), r.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  }
  close(fd);
}

// Every `offgraph_memory_used_bytes{...}` sample against its `offgraph_memory_budget_bytes`.
struct BudgetRow {
  double used = -1, limit = -1;
};
std::map<std::string, BudgetRow> budget_rows(const std::string &metrics) {
  std::map<std::string, BudgetRow> rows;
  for (const char *family : {"offgraph_memory_used_bytes{", "offgraph_memory_budget_bytes{"}) {
    for (size_t at = metrics.find(family); at != std::string::npos;
         at = metrics.find(family, at + 1)) {
      const size_t from = at + std::strlen(family), close = metrics.find('}', at);
      const std::string labels = metrics.substr(from, close - from);
      const double v = std::stod(metrics.substr(close + 2));
      const bool used = std::string_view(family).find("used") != std::string_view::npos;
      (used ? rows[labels].used : rows[labels].limit) = v;
    }
  }
  return rows;
}

TEST(ServerSoak, MixedRequestsUnderSmallBudgetsLoseNothing) {
  // `make soak` sends 20,000 (OFFGRAPH_SOAK_REQUESTS); every ctest run 1,200, a tenth as many
  // under the sanitizers.
  const char *env = std::getenv("OFFGRAPH_SOAK_REQUESTS");
#ifdef OFFGRAPH_SOAK_SANITIZED
  constexpr int kDefaultRequests = 120;
#else
  constexpr int kDefaultRequests = 1200;
#endif
  const int total = env ? std::max(64, std::atoi(env)) : kDefaultRequests;
  constexpr int kClients = 32;
  // The caches are full by then: conversations, snapshots, images, grammar tables.
  const int warm_up = std::min(std::max(total / 10, 400), total / 2);
  ImageModelFiles paths("soak");
  auto model = std::move(model::Model::load(paths.text)).value();
  auto vision = std::move(model::VisionModel::load(paths.mmproj, 64)).value();
  engine::ImageOptions io;
  io.max_bytes = int64_t(1) << 20;
  io.cache_bytes = 2 * 100 * 64 * 4; // two images of 100 rows
  io.rows_budget = 6 * 100 * 64 * 4; // six alive at once
  engine::ImageEncoder encoder(*vision, io);
  auto tok = text::Tokenizer::from_gguf(paths.text);
  ASSERT_TRUE(tok.ok());
  ImageServing images{&encoder,
                      {*(*tok)->find_token("<|patch|>"), *(*tok)->find_token("<|image_start|>"),
                       *(*tok)->find_token("<|image_end|>")}};
  engine::EngineOptions eo = small_engine(1024, 32);
  eo.max_active = 8, eo.max_cached = 6, eo.max_queue = 48, eo.snapshot_every = 64;
  {
    engine::EngineOptions measuring = eo;
    measuring.compute_budget = int64_t(1) << 40; // to read what steps need
    auto probe = engine::Engine::create(*model, measuring);
    ASSERT_TRUE(probe.ok()) << probe.message();
    // Room for two of the longest requests sent at once: admission decides, requests wait.
    engine::Request longest;
    longest.prompt.assign(1000, 1);
    longest.max_tokens = 24;
    longest.message_starts = {0, 500, 600};
    eo.kv_budget = 2 * (*probe)->peak_kv_bytes(longest);
    // Compute buffers: halfway between one token's step and a full prefill chunk at the full
    // context (the CPU's), so that long prompts and busy steps run smaller.
    const engine::Engine::ComputeNeeds &needs = (*probe)->compute_needs();
    ASSERT_EQ(needs.one_token.size(), 1u);
    eo.compute_budget = (needs.one_token[0].second + needs.full_chunk[0].second) / 2;
  }
  ServerOptions so = opts("soak");
  auto server = std::move(Server::create(*model, eo, so, images)).value();
  ASSERT_TRUE(server->start().ok());
  const int port = server->port();

  std::vector<std::string> pngs;
  for (int i = 0; i < 5; ++i)
    pngs.push_back("data:image/png;base64," +
                   base64(offgraph::testing::random_png(280, 280, 90 + uint64_t(i))));
  std::vector<std::string> bases; // conversations that branches continue
  for (int i = 0; i < 6; ++i) {
    std::string s = "Conversation " + std::to_string(i) + ":";
    for (int w = 0; w < 60 + 20 * i; ++w) s += " word" + std::to_string((w * 7 + i) % 50);
    bases.push_back(s);
  }
  const json schema = {
      {"type", "object"},
      {"properties",
       {{"name", {{"type", "string"}, {"maxLength", 12}}}, {"n", {{"type", "integer"}}}}},
      {"required", {"name", "n"}}};

  std::atomic<int> next{0}, ok{0}, refused{0}, hung_up{0}, bad{0};
  std::atomic<int64_t> warm_rss{0};
  std::mutex bad_mutex;
  std::vector<std::string> bad_answers;
  std::atomic<bool> over_budget{false};
  std::string over_budget_row;
  auto client = [&](int c) {
    std::mt19937 rng(uint32_t(7000 + c));
    httplib::Client http("127.0.0.1", port);
    http.set_read_timeout(300, 0);
    for (int i; (i = next++) < total;) {
      if (i == warm_up) warm_rss = resident_bytes();
      const int kind = int(rng() % 20);
      json req = chat(2 + int(rng() % 14), "Request " + std::to_string(i));
      std::string text;
      if (kind < 4) { // a long prompt
        for (int w = 0; w < 80 + int(rng() % 200); ++w)
          text += " long" + std::to_string(rng() % 90);
        req["messages"][0]["content"] = text;
      } else if (kind < 7) { // a branch of a conversation
        req["messages"] = {{{"role", "user"}, {"content", bases[rng() % bases.size()]}},
                           {{"role", "assistant"}, {"content", "Noted."}},
                           {{"role", "user"}, {"content", "Branch " + std::to_string(rng() % 5)}}};
      } else if (kind < 9) {
        req["n"] = 2, req["temperature"] = 0.8, req["seed"] = i;
      } else if (kind < 11) { // an image
        req["messages"][0]["content"] = {
            {{"type", "image_url"}, {"image_url", {{"url", pngs[rng() % pngs.size()]}}}},
            {{"type", "text"}, {"text", "Describe it."}}};
      } else if (kind < 13) {
        req["response_format"] = {{"type", "json_schema"},
                                  {"json_schema", {{"name", "t"}, {"schema", schema}}}};
        req["max_tokens"] = 24;
      } else if (kind < 14) {
        req["speculative.type"] = "ngram";
        req["messages"][0]["content"] = "say it again: one two three one two three one two three";
      } else if (kind < 15) {
        req["logprobs"] = true, req["top_logprobs"] = 2;
      } else if (kind < 17) {
        req["stream"] = true;
      }
      // 15% of requests of every kind: the client hangs up, before or after the answer starts (40
      // tokens take longer).
      if (rng() % 100 < 15) {
        req["max_tokens"] = 40;
        hang_up(port, req.dump(), int(rng() % 60));
        ++hung_up;
        continue;
      }
      auto r = http.Post("/v1/chat/completions", req.dump(), "application/json");
      if (r && r->status == 200) {
        ++ok;
      } else if (r && r->status == 429) {
        ++refused;
      } else {
        ++bad;
        std::lock_guard lock(bad_mutex);
        if (bad_answers.size() < 5)
          bad_answers.push_back(r ? std::to_string(r->status) + " " + r->body.substr(0, 300)
                                  : "no answer: " + httplib::to_string(r.error()) + " (kind " +
                                        std::to_string(kind) + ")");
      }
      if (i % 50 == c % 50) { // now and then: every budget within its limit
        auto m = http.Get("/metrics");
        if (m)
          for (const auto &[labels, row] : budget_rows(m->body))
            if (row.limit > 0 && row.used > row.limit && !over_budget.exchange(true))
              over_budget_row =
                  labels + ": " + std::to_string(row.used) + " > " + std::to_string(row.limit);
      }
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) clients.emplace_back(client, c);
  for (auto &t : clients) t.join();
  const double client_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(bad, 0);
  for (const std::string &b : bad_answers) ADD_FAILURE() << b;
  EXPECT_FALSE(over_budget) << over_budget_row;
  EXPECT_EQ(ok + refused + hung_up, total);
  EXPECT_GT(ok, total / 2);

  // Settled: every request read was accepted or refused, every accepted one ended.
  httplib::Client probe("127.0.0.1", port);
  auto metric = [&](const std::string &name) {
    auto m = probe.Get("/metrics");
    if (!m) return -1.0;
    const size_t at = m->body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(m->body.substr(at + name.size() + 2));
  };
  // Read: every request (a hung-up one may take a moment more), or after 3 s all but those a
  // client closed before the server read them or admitted them (an image wait it left).
  bool settled = false;
  for (int i = 0; i < 600 && !settled; ++i) {
    const double in = metric("offgraph_requests_total");
    // A client that hangs up may close before the server reads its request.
    const double read = in + metric("offgraph_requests_rejected_total") +
                        metric("offgraph_requests_abandoned_total");
    settled =
        (read == total || (i >= 60 && read >= total - hung_up)) && read <= total &&
        metric("offgraph_requests_completed_total") + metric("offgraph_client_disconnects_total") ==
            in &&
        metric("offgraph_sequences_active") == 0 && metric("offgraph_queue_depth") == 0;
    if (!settled) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(settled) << "accepted " << metric("offgraph_requests_total") << ", refused "
                       << metric("offgraph_requests_rejected_total") << ", client errors "
                       << metric("offgraph_requests_client_errors_total") << ", completed "
                       << metric("offgraph_requests_completed_total") << ", disconnects "
                       << metric("offgraph_client_disconnects_total") << ", active "
                       << metric("offgraph_sequences_active") << ", queued "
                       << metric("offgraph_queue_depth") << "; sent " << total;
  EXPECT_EQ(metric("offgraph_requests_server_errors_total"), 0);
  EXPECT_EQ(metric("offgraph_sequences_cached"), metric("offgraph_sequences_held"));
  // The budgets are back to what the caches keep.
  std::this_thread::sleep_for(std::chrono::milliseconds(200)); // the engine's idle step
  auto m = probe.Get("/metrics");
  ASSERT_TRUE(m);
  auto rows = budget_rows(m->body);
  const BudgetRow kv = rows["budget=\"kv\",flag=\"--kv-mib\""];
  const BudgetRow cached = rows["budget=\"cached_conversations\",flag=\"--cache-mib\""];
  const BudgetRow image_rows = rows["budget=\"image_rows\",flag=\"--image-mib\""];
  const BudgetRow image_cache = rows["budget=\"image_cache\",flag=\"--image-cache\""];
  EXPECT_GT(kv.used, 0);
  EXPECT_LE(kv.used, cached.used); // the cached conversations' (their logits besides)
  EXPECT_EQ(image_rows.used, image_cache.used);
  const int64_t end_rss = resident_bytes();
  std::printf("[ soak     ] %.1f s of clients, %.1f s to settle\n", client_seconds,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
                  client_seconds);
  std::printf("[ soak     ] %d requests from %d clients: %d answered, %d refused with 429, %d "
              "hung up; %.0f accepted, %.0f cancelled by hang-ups; %.0f generated tokens; %.0f "
              "images encoded; %.0f step graphs refused by the compute budget; RSS %.1f MiB "
              "after %d requests, %.1f MiB at the end\n",
              total, kClients, ok.load(), refused.load(), hung_up.load(),
              metric("offgraph_requests_total"), metric("offgraph_client_disconnects_total"),
              metric("offgraph_generated_tokens_total"), double(encoder.stats().encoded),
              metric("offgraph_compute_budget_refusals_total"), double(warm_rss) / 1048576, warm_up,
              double(end_rss) / 1048576);
#ifndef OFFGRAPH_SOAK_SANITIZED // the sanitizers' quarantine holds freed memory
  EXPECT_LE(double(end_rss), 1.10 * double(warm_rss));
#endif
  server->stop();
}

} // namespace
} // namespace offgraph::server::testing
