// GET /metrics: Prometheus text of what the server and engine did and hold.
#pragma once

#include "engine/engine.h"
#include "kv/kv_store.h"

#include <atomic>
#include <cstdint>
#include <string>

namespace offgraph::server {

// Counters kept by the HTTP side (the engine keeps its own).
struct HttpCounters {
  std::atomic<int64_t> requests{0}, rejected{0}, client_errors{0}, server_errors{0},
      unauthorized{0}, disconnects{0}, completed{0}, dropped_tools{0}, abandoned{0};
};

// What the KV store holds, by kind and tensor, and how large its rings are.
struct KvMetrics {
  int64_t flat = 0, ring = 0, snapshots = 0, k = 0, v = 0, held = 0, minimum = 0, buffers = 0;
  int64_t pages = 0, shared_pages = 0, page_bytes = 0; // flat pages in use, shared, one's size
  int64_t free_warm_pages = 0; // free pages whose memory the process keeps (the rest went back)
  std::string k_type, v_type;
  int32_t sequences = 0;
  int32_t ring_rows_max = 0;    // the largest ring any sequence holds
  int32_t ring_rows_design = 0; // window + ring lead - 1 of the widest sliding layer
};
KvMetrics kv_metrics(const kv::KvStore &store);

struct MetricsInput {
  bool ready = false;
  engine::EngineStats engine;
  size_t active = 0, queued = 0, cached = 0, tree_nodes = 0, snapshots = 0;
  int64_t cached_bytes = 0, kv_budget = 0;
  size_t grammar_tables = 0, grammar_table_bytes = 0; // mask tables shared through the vocabulary
  KvMetrics kv;
  // One row per memory budget (docs/reliability.md, "Budgets"): what counts against it now and
  // its limit (0: none), with the flag that sets it.
  struct Budget {
    std::string name, flag;
    int64_t used = 0, limit = 0;
  };
  std::vector<Budget> budgets;
  // Layers on other devices (docs/backends.md): per RPC device, its name, the bytes sent to its
  // server and received from it, and whether it still answers.
  struct Device {
    std::string name;
    int64_t sent = 0, received = 0;
    bool up = true;
  };
  std::vector<Device> devices;
  // The memory ledger by device (docs/reliability.md, "Memory budgets"): per device and use
  // (weights, kv, draft_kv, compute), the bytes it holds now.
  struct DeviceMemory {
    std::string device, use;
    int64_t bytes = 0;
  };
  std::vector<DeviceMemory> device_memory;
  // Each device's part of a budget (use: kv, draft_kv).
  std::vector<DeviceMemory> device_budgets;
};
std::string render_metrics(const MetricsInput &in, const HttpCounters &http);

} // namespace offgraph::server
