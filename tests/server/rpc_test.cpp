// The server with its model's layers split over two ggml-rpc-server processes on 127.0.0.1
// (docs/backends.md): the same answers as the CPU alone, prefix reuse across the split, traffic
// in /metrics; and a server that dies mid-request ends that request with an error naming it,
// then new work gets 503 and /health says why, while the process goes on; one that freezes
// mid-request does not hold the server's shutdown.
#include "live_server.h"
#include "rpc_servers.h"

#include <thread>

namespace offgraph::server::testing {
namespace {

using offgraph::testing::RpcServers;

struct Shared {
  std::string path = make_model(16, 11, "rpc");
  ~Shared() { fs::remove(path); }
};
Shared &shared() {
  static Shared s;
  return s;
}

std::unique_ptr<model::Model> load(const std::vector<std::string> &rpc) {
  std::shared_ptr<const model::Devices> devices;
  if (!rpc.empty()) {
    model::DeviceOptions o;
    o.gpus.emplace(); // the RPC servers alone, whatever GPUs this machine has
    o.rpc = rpc;
    auto d = model::Devices::open(o);
    EXPECT_TRUE(d.ok()) << d.message();
    if (!d.ok()) return nullptr;
    devices = *d;
  }
  auto m = model::Model::load(shared().path, nullptr, devices);
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(m).value() : nullptr;
}

json turn(const json &messages, int max_tokens) {
  return {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// A labelled sample of /metrics, or -1.
double labelled(Running &run, const std::string &sample) {
  auto m = run.client->Get("/metrics");
  if (!m) return -1;
  const size_t at = m->body.find("\n" + sample + " ");
  return at == std::string::npos ? -1.0 : std::stod(m->body.substr(at + sample.size() + 2));
}

TEST(ServerRpc, ASplitModelAnswersAsTheCpuAndReusesItsPrefixes) {
  RpcServers rpc(2);
  ASSERT_TRUE(rpc.ok());
  auto cpu_model = load({});
  auto split_model = load(rpc.endpoints());
  ASSERT_TRUE(cpu_model && split_model);
  Running cpu(*cpu_model, small_engine(), opts("cpu"));
  // The split server has a KV budget, which /metrics splits over the devices.
  engine::EngineOptions budgeted = small_engine();
  budgeted.kv_budget = int64_t(8) << 20;
  Running split(*split_model, budgeted, opts("split"));
  // A three-turn conversation (each turn's answer 40 tokens: the window-16 rings wrap), and a
  // second conversation sharing its system message.
  json messages = json::array({{{"role", "system"}, {"content", "You are terse."}},
                               {{"role", "user"}, {"content", "Name three rivers."}}});
  for (int t = 0; t < 3; ++t) {
    auto [s0, a] = cpu.post("/v1/chat/completions", turn(messages, 40));
    auto [s1, b] = split.post("/v1/chat/completions", turn(messages, 40));
    ASSERT_EQ(s0, 200) << a.dump();
    ASSERT_EQ(s1, 200) << b.dump();
    EXPECT_EQ(b["choices"][0]["message"], a["choices"][0]["message"]) << "turn " << t;
    EXPECT_EQ(b["usage"]["completion_tokens"], a["usage"]["completion_tokens"]);
    if (t > 0) { // the conversation so far came from the cache, on the devices
      EXPECT_GT(b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 20) << b.dump();
    }
    messages.push_back(a["choices"][0]["message"]);
    messages.push_back({{"role", "user"}, {"content", "And " + std::to_string(t) + " more?"}});
  }
  json other = json::array({messages[0], {{"role", "user"}, {"content", "Name a mountain."}}});
  auto [s2, c] = cpu.post("/v1/chat/completions", turn(other, 24));
  auto [s3, d] = split.post("/v1/chat/completions", turn(other, 24));
  ASSERT_EQ(s2, 200);
  ASSERT_EQ(s3, 200);
  EXPECT_EQ(d["choices"][0]["message"], c["choices"][0]["message"]);
  // Traffic per device, and both up.
  const model::Devices &devs = split_model->devices();
  for (int32_t i = 0; i < 2; ++i) {
    const std::string label = "{device=\"" + devs.name(i) + "\"}";
    EXPECT_GT(labelled(split, "offgraph_rpc_bytes_sent_total" + label), 0) << label;
    EXPECT_GT(labelled(split, "offgraph_rpc_bytes_received_total" + label), 0) << label;
    EXPECT_EQ(labelled(split, "offgraph_rpc_up" + label), 1) << label;
  }
  EXPECT_TRUE(rpc.alive(0) && rpc.alive(1));
  // The ledger by device: each server's uploaded weights, the CPU's counted from the file by
  // name (every tensor but those of the layers on the servers, "blk.N.", and of the output head
  // where a server holds it; the token embedding always); every device holds KV of its layers
  // and compute buffers; the KV rows add up to the KV budget's row.
  auto m = split.client->Get("/metrics");
  ASSERT_TRUE(m);
  auto sample = [&](const std::string &s) {
    const size_t at = m->body.find("\n" + s + " ");
    return at == std::string::npos ? -1.0 : std::stod(m->body.substr(at + s.size() + 2));
  };
  const std::vector<int64_t> uploaded = split_model->device_weight_bytes();
  int64_t cpu_weights = 0;
  const ggml_context *tensors = split_model->file().tensors();
  for (ggml_tensor *t = ggml_get_first_tensor(tensors); t; t = ggml_get_next_tensor(tensors, t)) {
    const std::string name = ggml_get_name(t);
    int layer = -1;
    std::sscanf(name.c_str(), "blk.%d.", &layer);
    const int32_t dev = layer >= 0                     ? split_model->layer_device(layer)
                        : name.rfind("output", 0) == 0 ? split_model->output_device()
                                                       : devs.cpu();
    if (devs.is_cpu(dev)) cpu_weights += int64_t(ggml_nbytes(t));
  }
  double kv = 0;
  for (int32_t i = 0; i < devs.size(); ++i) {
    auto row = [&](const char *use) {
      return sample("offgraph_device_memory_bytes{device=\"" + devs.name(i) + "\",use=\"" + use +
                    "\"}");
    };
    if (devs.is_cpu(i)) {
      EXPECT_EQ(row("weights"), double(cpu_weights));
    } else {
      EXPECT_GT(uploaded[size_t(i)], 0);
      EXPECT_EQ(row("weights"), double(uploaded[size_t(i)])) << devs.name(i);
      EXPECT_GT(row("kv"), 0) << devs.name(i);
      kv += row("kv");
    }
    EXPECT_GT(row("compute"), 0) << devs.name(i);
  }
  const double cpu_kv =
      sample("offgraph_device_memory_bytes{device=\"CPU\",use=\"kv\"}"); // -1: none there
  EXPECT_EQ(kv + std::max(0.0, cpu_kv),
            sample("offgraph_memory_used_bytes{budget=\"kv\",flag=\"--kv-mib\"}"));
  // The most of the KV budget each device that holds KV can hold (its largest part of the store:
  // rings alone or a full-context sequence): at least what it holds now, together at least the
  // budget (each rounded down), each at most all of it.
  const double budget = sample("offgraph_memory_budget_bytes{budget=\"kv\",flag=\"--kv-mib\"}");
  EXPECT_EQ(budget, double(int64_t(8) << 20));
  double parts = 0;
  for (int32_t i = 0; i < devs.size(); ++i) {
    const std::string label = "{device=\"" + devs.name(i) + "\",use=\"kv\"}";
    const double part = sample("offgraph_device_memory_budget_bytes" + label);
    if (!devs.is_cpu(i)) {
      EXPECT_GT(part, 0) << label;
    }
    EXPECT_GE(part, sample("offgraph_device_memory_bytes" + label)) << label;
    EXPECT_LE(part, budget) << label;
    parts += std::max(0.0, part);
  }
  EXPECT_GE(parts, budget - double(devs.size()));
}

TEST(ServerRpc, AServerThatDiesMidRequestEndsItWithAnErrorThenNewWorkGets503) {
  RpcServers rpc(2);
  ASSERT_TRUE(rpc.ok());
  auto m = load(rpc.endpoints());
  ASSERT_TRUE(m);
  Running run(*m, small_engine(2048, 32), opts("dies"));
  auto [s0, ok] = run.post("/v1/completions", {{"prompt", "Warm up"}, {"max_tokens", 4}});
  ASSERT_EQ(s0, 200) << ok.dump();
  // A long answer, streamed; the second server is killed once 50 of its tokens were generated.
  const double before = run.metric("offgraph_generated_tokens_total");
  json req = {
      {"prompt", "Once upon a time"}, {"max_tokens", 1500}, {"temperature", 0}, {"stream", true}};
  std::thread killer([&] {
    httplib::Client probe("127.0.0.1", run.server->port());
    for (int i = 0; i < 2000; ++i) {
      auto got = probe.Get("/metrics");
      const std::string key = "\noffgraph_generated_tokens_total ";
      if (got && got->body.find(key) != std::string::npos &&
          std::stod(got->body.substr(got->body.find(key) + key.size())) > before + 50)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    rpc.kill_server(1);
  });
  auto r = run.client->Post("/v1/completions", req.dump(), "application/json");
  killer.join();
  ASSERT_TRUE(r) << "the stream broke instead of ending";
  const std::string &body = r->body;
  EXPECT_NE(body.find(rpc.endpoint(1)), std::string::npos)
      << body.substr(body.size() > 600 ? body.size() - 600 : 0);
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos);
  // Then: 503 naming the device, for new work and /health.
  auto [s1, refused] = run.post("/v1/completions", {{"prompt", "Again"}, {"max_tokens", 4}});
  EXPECT_EQ(s1, 503) << refused.dump();
  EXPECT_EQ(refused["error"]["code"], "device_lost") << refused.dump();
  auto h = run.client->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_NE(h->body.find(rpc.endpoint(1)), std::string::npos) << h->body;
  const std::string label = "{device=\"" + m->devices().name(1) + "\"}";
  EXPECT_EQ(labelled(run, "offgraph_rpc_up" + label), 0);
  EXPECT_TRUE(rpc.alive(0));
}

TEST(ServerRpc, AServerThatFreezesMidRequestDoesNotHoldTheShutdown) {
  RpcServers rpc(2);
  ASSERT_TRUE(rpc.ok());
  auto m = load(rpc.endpoints());
  ASSERT_TRUE(m);
  ServerOptions so = opts("frozen");
  so.device_stop_grace_seconds = 1;
  auto server = std::move(Server::create(*m, small_engine(2048, 32), so)).value();
  ASSERT_TRUE(server->start().ok());
  httplib::Client client("127.0.0.1", server->port());
  client.set_read_timeout(120, 0);
  // A long streamed answer; the second server is stopped once 30 tokens came back.
  std::atomic<int> chunks{0};
  std::thread reader([&] {
    json req = {
        {"prompt", "Once upon a time"}, {"max_tokens", 1500}, {"temperature", 0}, {"stream", true}};
    httplib::Request r;
    r.method = "POST";
    r.path = "/v1/completions";
    r.body = req.dump();
    r.set_header("Content-Type", "application/json");
    r.content_receiver = [&](const char *, size_t, uint64_t, uint64_t) {
      ++chunks;
      return true;
    };
    client.send(r);
  });
  for (int i = 0; i < 4000 && chunks < 30; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GE(chunks.load(), 30) << "the stream did not start";
  rpc.freeze(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300)); // a step now waits on it
  // The shutdown ends (bounded here so that a hang is a failure, not a stuck test run).
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    server->stop();
    stopped = true;
  });
  for (int i = 0; i < 600 && !stopped; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool ended = stopped;
  if (!ended) rpc.kill_server(1); // lets the shutdown finish so that the test can end
  stopper.join();
  reader.join();
  EXPECT_TRUE(ended) << "the shutdown waited on the frozen server for 60 s";
  // The devices were given up on by the shutdown (a stopping server cuts its streams, as on the
  // CPU alone: requests in flight end as cancelled).
  EXPECT_NE(m->devices().failure().find("offgraph is stopping"), std::string::npos)
      << m->devices().failure();
  EXPECT_GE(chunks.load(), 30);
  EXPECT_TRUE(rpc.alive(0));
}

} // namespace
} // namespace offgraph::server::testing
