// The OpenAI routes end to end on 127.0.0.1: an in-process server on a free port, a real HTTP
// client, a generated Muse Glimmer model (the real chat template embedded).
#include "server/server.h"
#include "synth/synth.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace offgraph::server {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

ServerOptions opts(const std::string &name) {
  ServerOptions o;
  o.host = "127.0.0.1", o.port = 0, o.model_name = name;
  return o;
}

struct Live {
  std::string path;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<Server> server;
  std::unique_ptr<httplib::Client> client;
  explicit Live(int32_t snapshot_every = 0, bool start_snapshots = true) {
    setenv("OMP_WAIT_POLICY", "passive", 0);
    path = (fs::temp_directory_path() /
            ("offgraph-server-test-" + std::to_string(::getpid()) + "-" +
             std::to_string(snapshot_every) + (start_snapshots ? "" : "-nostart") + ".gguf"))
               .string();
    synth::SynthSpec s = synth::preset("tiny", "muse-glimmer").value();
    s.vocab_path = std::string(OFFGRAPH_LLAMA_TREE) + "/models/ggml-vocab-llama-bpe.gguf";
    s.template_path = std::string(OFFGRAPH_LLAMA_TREE) + "/models/templates/muse-glimmer.jinja";
    s.n_embd = 64, s.head_dim = 16, s.window = 16, s.seed = 3;
    EXPECT_TRUE(synth::write_model(s, path).ok());
    model = std::move(model::Model::load(path)).value();
    engine::EngineOptions eo;
    eo.context = 512, eo.max_write = 32, eo.max_active = 4, eo.max_cached = 4;
    eo.types = {GGML_TYPE_F32, GGML_TYPE_F32};
    eo.snapshot_every = snapshot_every;
    eo.start_snapshots = start_snapshots;
    server = std::move(Server::create(*model, eo, opts("test-model"))).value();
    EXPECT_TRUE(server->start().ok());
    client = std::make_unique<httplib::Client>("127.0.0.1", server->port());
    client->set_read_timeout(60, 0);
  }
  ~Live() {
    server->stop();
    fs::remove(path);
  }
  std::pair<int, json> post(const std::string &route, const json &body) {
    auto r = client->Post(route.c_str(), body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
};

Live &live() {
  static Live l;
  return l;
}

json chat(int max_tokens, std::string user = "Hello there") {
  return {{"messages", {{{"role", "user"}, {"content", user}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

TEST(Server, HealthAndModels) {
  auto h = live().client->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = live().client->Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "test-model");
}

// The kernel's queue of connections the server has not accepted yet holds a burst of clients:
// cpp-httplib's own backlog (5) overflowed 50 times in one 1,200-request soak of 32 clients. The
// listening socket's limit is read back through TCP_INFO (Linux reports a listener's backlog
// limit in tcpi_sacked and its queue in tcpi_unacked).
TEST(Server, TheListenQueueHoldsABurstOfClients) {
  const int port = live().server->port();
  int listener = -1;
  DIR *dir = opendir("/proc/self/fd");
  ASSERT_NE(dir, nullptr);
  while (dirent *entry = readdir(dir)) {
    const int fd = std::atoi(entry->d_name);
    sockaddr_in local{};
    socklen_t ll = sizeof local;
    int accepting = 0;
    socklen_t al = sizeof accepting;
    if (fd > 2 && getsockname(fd, reinterpret_cast<sockaddr *>(&local), &ll) == 0 &&
        local.sin_family == AF_INET && ntohs(local.sin_port) == port &&
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &al) == 0 && accepting)
      listener = fd;
  }
  closedir(dir);
  ASSERT_GE(listener, 0) << "no listening socket on port " << port;
  tcp_info info{};
  socklen_t len = sizeof info;
  ASSERT_EQ(getsockopt(listener, IPPROTO_TCP, TCP_INFO, &info, &len), 0);
  EXPECT_EQ(info.tcpi_state, TCP_LISTEN);
  // The kernel caps a backlog at net.core.somaxconn.
  std::ifstream cap("/proc/sys/net/core/somaxconn");
  uint32_t somaxconn = 1024;
  cap >> somaxconn;
  EXPECT_GE(info.tcpi_sacked, std::min<uint32_t>(1024, somaxconn)) << "the listen backlog";
  EXPECT_GT(info.tcpi_sacked, 5u) << "cpp-httplib's own backlog";
}

TEST(Server, ChatCompletionShapeUsageAndPrefixReuse) {
  auto [status, body] = live().post("/v1/chat/completions", chat(12));
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["object"], "chat.completion");
  const json &choice = body["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_TRUE(choice["finish_reason"] == "length" || choice["finish_reason"] == "stop");
  const int prompt = body["usage"]["prompt_tokens"];
  EXPECT_GT(prompt, 20); // the template's system block and the user turn
  EXPECT_LE(body["usage"]["completion_tokens"].get<int>(), 12);
  EXPECT_EQ(body["usage"]["total_tokens"].get<int>(),
            prompt + body["usage"]["completion_tokens"].get<int>());
  // The same request again: the cached conversation serves the whole prompt (its snapshot and the
  // logits kept at its end), and greedy decoding gives the same message.
  auto [status2, again] = live().post("/v1/chat/completions", chat(12));
  ASSERT_EQ(status2, 200);
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], prompt);
  EXPECT_EQ(again["choices"][0]["message"], choice["message"]);
}

TEST(Server, StreamingDeltasAddUpToTheAnswer) {
  json req = chat(10, "Stream this");
  auto [status, whole] = live().post("/v1/chat/completions", req);
  ASSERT_EQ(status, 200);
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  auto r = live().client->Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  std::string content, reasoning;
  bool done = false, usage = false;
  std::string finish;
  size_t at = 0;
  while ((at = r->body.find("data: ", at)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", at);
    const std::string data = r->body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    json chunk = json::parse(data);
    if (chunk.contains("usage")) {
      usage = true;
      EXPECT_EQ(chunk["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
    }
    if (chunk["choices"].empty()) continue;
    const json &d = chunk["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null())
      finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_TRUE(usage);
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
  EXPECT_EQ(content, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(reasoning, whole["choices"][0]["message"].value("reasoning_content", ""));
}

TEST(Server, StopStringCutsTheAnswer) {
  auto [status, whole] = live().post(
      "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}});
  ASSERT_EQ(status, 200);
  const std::string text = whole["choices"][0]["text"];
  ASSERT_GT(text.size(), 8u);
  const std::string stop = text.substr(4, 3);
  const size_t cut = text.find(stop);
  auto [status2, stopped] = live().post(
      "/v1/completions",
      {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}, {"stop", stop}});
  ASSERT_EQ(status2, 200);
  EXPECT_EQ(stopped["choices"][0]["text"], text.substr(0, cut));
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
}

TEST(Server, BadRequestsGetClearErrors) {
  auto bad = live().client->Post("/v1/chat/completions", "{not json", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("not valid JSON"), std::string::npos);
  json wrong = chat(5);
  wrong["temperature"] = "hot";
  auto [s1, b1] = live().post("/v1/chat/completions", wrong);
  EXPECT_EQ(s1, 400);
  EXPECT_NE(b1["error"]["message"].get<std::string>().find("'temperature'"), std::string::npos);
  auto [s2, b2] = live().post("/v1/chat/completions", chat(500));
  EXPECT_EQ(s2, 400);
  EXPECT_NE(b2["error"]["message"].get<std::string>().find("the context holds 512"),
            std::string::npos);
  EXPECT_EQ(b2["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(b2["error"]["param"], "max_tokens");
  json many = chat(5);
  many["n"] = 17;
  EXPECT_EQ(live().post("/v1/chat/completions", many).first, 400);
  EXPECT_EQ(live().post("/v1/chat/completions", {{"messages", json::array()}}).first, 400);
  // The server goes on serving.
  EXPECT_EQ(live().post("/v1/chat/completions", chat(2)).first, 200);
}

// The grammar warm-up (server/structured.h) runs at startup, and its tables are what the next
// constrained request shares.
TEST(Server, GrammarTablesAreMadeAtStartup) {
  auto value = [](const std::string &body, const std::string &name) {
    const size_t at = body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(body.substr(at + name.size() + 2));
  };
  double tables = 0;
  for (int i = 0; i < 600 && tables < 50; ++i) { // the warm-up makes hundreds; 30 s at most
    auto m = live().client->Get("/metrics");
    ASSERT_TRUE(m);
    tables = value(m->body, "offgraph_grammar_tables");
    if (tables < 50) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(tables, 50);
  auto m = live().client->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_GT(value(m->body, "offgraph_grammar_table_bytes"), 0);
}

TEST(Server, MetricsCountWhatHappened) {
  ASSERT_EQ(live().post("/v1/chat/completions", chat(3, "count me")).first, 200);
  // Metrics are published at the end of each step; the answer may arrive just before.
  auto m = live().client->Get("/metrics");
  for (int i = 0;
       i < 100 && m && m->body.find("\noffgraph_sequences_active 0\n") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    m = live().client->Get("/metrics");
  }
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  auto value = [&](const std::string &name) {
    const size_t at = m->body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(m->body.substr(at + name.size() + 2));
  };
  EXPECT_GE(value("offgraph_requests_total"), 1);
  EXPECT_GE(value("offgraph_generated_tokens_total"), 3);
  EXPECT_GT(value("offgraph_kv_buffer_bytes"), 0);
  EXPECT_EQ(value("offgraph_sequences_active"), 0);
  // Every memory budget, with what counts against it: the conversation just answered is cached
  // (max_cached 4), so KV is in use and the cached conversations hold some.
  auto budget_row = [&](const std::string &family, const std::string &budget,
                        const std::string &flag) {
    return value(family + "{budget=\"" + budget + "\",flag=\"" + flag + "\"}");
  };
  const double kv = budget_row("offgraph_memory_used_bytes", "kv", "--kv-mib");
  const double cached =
      budget_row("offgraph_memory_used_bytes", "cached_conversations", "--cache-mib");
  EXPECT_GT(cached, 0);
  EXPECT_GT(kv, 0);
  EXPECT_EQ(budget_row("offgraph_memory_budget_bytes", "kv", "--kv-mib"), 0); // none asked
  EXPECT_GE(budget_row("offgraph_memory_used_bytes", "snapshots", "--snapshot-mib"), 0);
  EXPECT_GT(budget_row("offgraph_memory_budget_bytes", "snapshots", "--snapshot-mib"), 0);
  EXPECT_EQ(budget_row("offgraph_memory_budget_bytes", "grammar_tables", "--grammar-mib"),
            256 << 20);
  EXPECT_LE(budget_row("offgraph_memory_used_bytes", "grammar_tables", "--grammar-mib"), 256 << 20);
  EXPECT_EQ(budget_row("offgraph_memory_used_bytes", "draft_kv", "--kv-mib"), 0);
  const double logits = budget_row("offgraph_memory_used_bytes", "step_logits", "");
  EXPECT_GT(logits, 0);
  EXPECT_LE(logits, budget_row("offgraph_memory_budget_bytes", "step_logits", ""));
  // The ledger by device, the CPU alone: every weight, the KV budget's bytes, compute buffers.
  auto device_row = [&](const std::string &use) {
    return value("offgraph_device_memory_bytes{device=\"CPU\",use=\"" + use + "\"}");
  };
  EXPECT_EQ(device_row("weights"), double(live().model->weight_bytes()));
  EXPECT_GT(device_row("weights"), 1e5);
  EXPECT_EQ(device_row("kv"), kv);
  EXPECT_GT(device_row("compute"), 0);
  EXPECT_EQ(device_row("draft_kv"), -1); // no draft model: no row
}

// A full queue answers 429 with Retry-After (a queue of 0 makes it certain), and under
// concurrent load every request is either served or refused up front: nothing is lost.
TEST(Server, FullQueueSays429AndNothingIsLost) {
  engine::EngineOptions eo;
  eo.context = 512, eo.max_write = 32, eo.max_active = 1, eo.max_cached = 0, eo.max_queue = 0;
  eo.types = {GGML_TYPE_F32, GGML_TYPE_F32};
  {
    auto closed = std::move(Server::create(*live().model, eo, opts("no-queue"))).value();
    ASSERT_TRUE(closed->start().ok());
    httplib::Client c("127.0.0.1", closed->port());
    auto r = c.Post("/v1/chat/completions", chat(4).dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 429);
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    EXPECT_NE(r->body.find("queue is full"), std::string::npos);
    closed->stop();
  }
  eo.max_queue = 1;
  auto server = std::move(Server::create(*live().model, eo, opts("small-queue"))).value();
  ASSERT_TRUE(server->start().ok());
  std::vector<int> statuses(4, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", server->port());
      c.set_read_timeout(60, 0);
      auto r = c.Post("/v1/chat/completions", chat(40, "long answer").dump(), "application/json");
      if (r) statuses[size_t(i)] = r->status;
    });
  for (auto &t : threads) t.join();
  server->stop();
  int ok = 0, limited = 0;
  for (int st : statuses) ok += st == 200, limited += st == 429;
  EXPECT_EQ(ok + limited, 4); // every request answered or refused up front
  EXPECT_GE(ok, 1);
}

// The agent pattern over HTTP on a sliding-window model: the second turn resends the history
// (the answer without its reasoning, as the template renders it) plus a new message. The rings
// have wrapped during the first answer, yet the whole first prompt is reused (restored from the
// snapshot at its end) and only the new part is computed.
TEST(Server, SecondTurnReusesTheWholeFirstPrompt) {
  json first = chat(60, "Plan a trip to Lisbon");
  auto [s1, r1] = live().post("/v1/chat/completions", first);
  ASSERT_EQ(s1, 200) << r1.dump();
  const int p1 = r1["usage"]["prompt_tokens"];
  json second = first;
  second["messages"].push_back(
      {{"role", "assistant"}, {"content", r1["choices"][0]["message"]["content"]}});
  second["messages"].push_back({{"role", "user"}, {"content", "And for two days in Porto?"}});
  auto [s2, r2] = live().post("/v1/chat/completions", second);
  ASSERT_EQ(s2, 200) << r2.dump();
  const int cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"];
  std::printf(
      "[ server   ] turn 1: %d prompt tokens, %d generated; turn 2: %d prompt tokens, %d cached\n",
      p1, r1["usage"]["completion_tokens"].get<int>(), r2["usage"]["prompt_tokens"].get<int>(),
      cached);
  EXPECT_GE(cached, p1); // nothing of the first prompt recomputed
  EXPECT_LT(cached, r2["usage"]["prompt_tokens"].get<int>()); // the new turn was computed
  auto m = live().client->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("offgraph_snapshot_restores_total"), std::string::npos);
  EXPECT_NE(m->body.find("offgraph_kv_pages "), std::string::npos);
  EXPECT_NE(m->body.find("offgraph_kv_pages_shared "), std::string::npos);
  EXPECT_NE(m->body.find("offgraph_prefix_tree_nodes "), std::string::npos);
  EXPECT_NE(m->body.find("offgraph_prefix_tree_snapshots "), std::string::npos);
}

// With periodic snapshots, the server tells the engine where each message's text starts: an edit
// at the start of a long message recomputes only that message onward, where the default server
// (snapshots at prompt ends only) recomputes the whole prompt.
// By default (and with periodic snapshots), an edited message resumes at its start; without
// message-start snapshots the system prompt before it is computed again.
TEST(Server, AnEditedMessageResumesAtItsStart) {
  static Live snapshots(1000); // message starts, and a grid longer than the prompts
  static Live without(0, false);
  std::string system = "You are a careful travel planner.";
  for (int i = 0; i < 12; ++i) system += " Rule " + std::to_string(i) + ": check the trains.";
  // Longer than the rings' slack (31 tokens here), so that no cached sequence can be rewound to
  // the edit.
  const std::string question = "A weekend in Lisbon: trams, the river, fish, a day trip to Sintra "
                               "or Cascais, a fado evening, and which quarter to sleep in, with "
                               "trains from the airport and a budget of 400 euros for two?";
  auto conversation = [&](const std::string &user) {
    return json{
        {"messages",
         {{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", user}}}},
        {"max_tokens", 2},
        {"temperature", 0}};
  };
  auto computed = [&](Live &l, const std::string &user) {
    auto [s, r] = l.post("/v1/chat/completions", conversation(user));
    EXPECT_EQ(s, 200) << r.dump();
    return r["usage"]["prompt_tokens"].get<int>() -
           r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  const std::string edited = "Two days in Porto: " + question;
  auto [st, t] = snapshots.post("/tokenize", {{"content", edited}});
  ASSERT_EQ(st, 200) << t.dump();
  const int edited_tokens = int(t["tokens"].size());
  for (Live *l : {&snapshots, &live(), &without}) computed(*l, question);
  // The user text and the template's tokens after it (its end and the generation header: 11 with
  // this template and vocabulary).
  for (Live *l : {&snapshots, &live()}) {
    const int resumed = computed(*l, edited);
    EXPECT_GE(resumed, edited_tokens);
    EXPECT_LE(resumed, edited_tokens + 12);
  }
  EXPECT_GT(computed(without, edited), edited_tokens + 12 + 40); // the system prompt again
}

} // namespace
} // namespace offgraph::server
