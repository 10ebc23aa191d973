// Devices: where a model's layers run. Local GPUs (ggml's CUDA backend, in the CUDA build:
// docs/gpu.md), ggml-rpc servers reached at HOST:PORT endpoints (docs/backends.md) and the local
// CPU. A layer's weights and its KV storage live on the device the split assigns it; the input
// embedding stays on the CPU, and the output head counts as one more layer of the split (as
// llama.cpp's --split-mode layer does).
#pragma once

#include "base/status.h"
#include "model/rpc_relay.h"

#include "ggml-backend.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace offgraph::model {

struct DeviceOptions {
  // Local GPUs by ggml's name ("CUDA0"), in split order; absent: every GPU found; empty: none.
  std::optional<std::vector<std::string>> gpus;
  // ggml-rpc-server endpoints, HOST:PORT, in the order the split lists them (after the GPUs).
  std::vector<std::string> rpc;
  // Proportions of the offloaded layers per device: one per GPU and RPC endpoint, or (without
  // n_gpu_layers) one more for the local CPU (last). Empty: equal parts, none on the CPU.
  std::vector<float> split;
  // llama.cpp's -ngl: the last N of the n_layer + 1 slots (layers, then the output head) go to
  // the GPUs and RPC servers, the first ones stay on the CPU. -1: all of them.
  int32_t n_gpu_layers = -1;
  // The RPC protocol has no authentication or encryption: endpoints outside 127.0.0.0/8 are
  // refused unless this is set (IPv6 addresses are refused: ggml-rpc cannot parse them).
  bool allow_remote = false;
};

class Devices {
public:
  // Connects to every endpoint (a clear error when one does not answer) and checks the split.
  // No endpoints: the CPU alone.
  static Result<std::shared_ptr<const Devices>> open(const DeviceOptions &options);
  static std::shared_ptr<const Devices> cpu_only();
  // Every device this build and machine offer, a line each (--list-devices); where no GPU is
  // offered, why (no GPU backend in this build, or the backend's own reason: no driver, ...).
  static std::string describe_available();
  // The local GPUs found (ggml's GPU and integrated-GPU devices), and, when there are none, why.
  static std::vector<ggml_backend_dev_t> local_gpus();
  static std::string why_no_gpu();

  // Devices in split order: the local GPUs, the RPC ones, then the CPU (always last, as ggml's
  // scheduler needs).
  int32_t size() const { return int32_t(devices_.size()); }
  int32_t cpu() const { return size() - 1; }
  bool is_cpu(int32_t d) const { return d == cpu(); }
  ggml_backend_dev_t device(int32_t d) const { return devices_[size_t(d)]; }
  ggml_backend_buffer_type_t buffer_type(int32_t d) const;
  // "CPU", "CUDA0 (NVIDIA H200)", or "RPC0 (127.0.0.1:50052)".
  std::string name(int32_t d) const;
  // The name of the device whose memory `buft` is (host memory: "CPU").
  std::string name_of(ggml_backend_buffer_type_t buft) const;
  const std::string &endpoint(int32_t d) const { return endpoints_[size_t(d)]; }
  // Empty while every server answers; else the first that stopped, and during what. A step
  // computed after that is not a result (RpcRelay answers for the server): Forward fails it.
  std::string failure() const;
  bool failed(int32_t d) const;
  // Gives up on every server still answering or waited on (RpcRelay::interrupt): for a shutdown
  // that must not wait on a server that froze.
  void interrupt(const std::string &why) const;
  // Bytes sent to and received from device d's server (0 for the CPU).
  int64_t bytes_to(int32_t d) const {
    return relays_[size_t(d)] ? relays_[size_t(d)]->bytes_to_server() : 0;
  }
  int64_t bytes_from(int32_t d) const {
    return relays_[size_t(d)] ? relays_[size_t(d)]->bytes_from_server() : 0;
  }

  // FREE_BUFFER requests to every server so far: a server forgets its stored graphs on each, so
  // a graph may be recomputed (Forward's reuse) only while this stays the same.
  int64_t buffer_frees() const {
    int64_t n = 0;
    for (const auto &relay : relays_)
      if (relay) n += relay->buffer_frees();
    return n;
  }

  // The device of each layer 0..n_layer-1 and of the output head (entry n_layer): slot i of
  // n_layer + 1 goes to the device whose cumulative share first passes i / (n_layer + 1).
  std::vector<int32_t> assign(int32_t n_layer) const;

private:
  std::vector<ggml_backend_dev_t> devices_;
  std::vector<std::string> endpoints_; // "" for the CPU
  // Each RPC device's connection goes through a relay of its own (null for the CPU).
  std::vector<std::unique_ptr<RpcRelay>> relays_;
  std::vector<float> shares_; // cumulative, normalised; last is 1
  int32_t n_gpu_layers_ = -1; // DeviceOptions::n_gpu_layers
};

// HOST:PORT as ggml-rpc takes it; an error naming what is wrong. `allow_remote` as above.
Status check_endpoint(const std::string &endpoint, bool allow_remote);

} // namespace offgraph::model
