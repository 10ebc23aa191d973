// RpcRelay: a loopback port between ggml-rpc's client in this process and one ggml-rpc-server.
//
// Why: the pinned ggml-rpc client aborts the process when a server goes away mid-request
// (RPC_STATUS_ASSERT in ggml-rpc.cpp). The relay forwards every request and response unchanged
// while the server answers; once it does not (the connection closed or broke), it records why and
// answers the rest itself: each request that waits for a response gets one of the size the client
// expects (zeros: no buffer, no memory, no data), so the client returns instead of aborting, and
// Forward reports the step failed by the failure recorded here. It also counts the bytes each way
// (docs/backends.md: traffic per token).
//
// The protocol it frames (ggml-rpc.cpp, protocol 7.0): a request is | cmd u8 | size u64 | data |;
// a response, for the commands that have one, | size u64 | data |; the client sends one request
// at a time and waits for its response before the next.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace offgraph::model {

class RpcRelay {
public:
  // Listens on 127.0.0.1 (an ephemeral port) for ggml-rpc's connections to the server at
  // `address` (resolved and checked once, by Devices::open: never resolved again, so a name
  // cannot point elsewhere later). Every process of this machine can connect to that port, as to
  // a loopback ggml-rpc-server (docs/backends.md).
  static std::unique_ptr<RpcRelay> start(const sockaddr_in &address, std::string *error);
  ~RpcRelay();
  RpcRelay(const RpcRelay &) = delete;
  RpcRelay &operator=(const RpcRelay &) = delete;

  // What ggml-rpc connects to: "127.0.0.1:PORT".
  const std::string &endpoint() const { return endpoint_; }
  // Gives up on the server (shutting down while a request waits on one that froze: it still
  // acknowledges at the TCP level, so the wait would never end); the request is answered as for
  // a lost server.
  void interrupt(const std::string &why);
  // Empty while the server answers; else what went wrong (stays set).
  std::string failure() const;
  bool failed() const { return failed_.load(); }
  // Bytes that went over the server's connection (not those answered for it once gone).
  int64_t bytes_to_server() const { return to_server_.load(); }
  int64_t bytes_from_server() const { return from_server_.load(); }
  // FREE_BUFFER requests seen: the server drops its stored graphs on each (ggml-rpc.cpp,
  // free_buffer), so a graph computed before one cannot be recomputed after it.
  int64_t buffer_frees() const { return buffer_frees_.load(); }

private:
  RpcRelay() = default;
  void run();
  // One client connection, request by request, until the client closes it.
  void serve(int client);
  void fail(const std::string &why);

  sockaddr_in server_{};
  std::string endpoint_;
  int listener_ = -1;
  // The server connection in use, for interrupt() and the destructor to cut. Under fd_mutex_
  // whenever it is cut or closed: another thread's shutdown() must never reach a descriptor
  // number closed and reused meanwhile (an HTTP client's socket).
  std::atomic<int> server_fd_{-1};
  std::mutex fd_mutex_;
  void close_server(int &server);
  void cut_server();
  std::thread thread_;
  std::atomic<bool> stopping_{false}, failed_{false};
  std::atomic<int64_t> to_server_{0}, from_server_{0}, buffer_frees_{0};
  mutable std::mutex mutex_;
  std::string failure_;
};

} // namespace offgraph::model
