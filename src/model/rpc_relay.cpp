#include "model/rpc_relay.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ggml.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

namespace offgraph::model {

namespace {

// ggml-rpc.cpp's commands (protocol 7.0) and the size of each one's response, -1 for none.
// GET_TENSOR's is the size its request asks for (kGetTensorSizeAt).
enum Cmd : uint8_t {
  kAllocBuffer = 0,
  kGetAlignment,
  kGetMaxSize,
  kBufferGetBase,
  kFreeBuffer,
  kBufferClear,
  kSetTensor,
  kSetTensorHash,
  kGetTensor,
  kCopyTensor,
  kGraphCompute,
  kGetDeviceMemory,
  kInitTensor,
  kGetAllocSize,
  kHello,
  kDeviceCount,
  kGraphRecompute,
  kMemsetTensor,
  kCmdCount
};
constexpr std::array<int64_t, kCmdCount> kResponseBytes = {
    16, 8, 8, 8, -1, -1, -1, 1, 0 /* asked */, 1, -1, 16, -1, 8, 4 + 24, 4, -1, -1};
constexpr size_t kRpcTensorBytes = 296;                    // sizeof(rpc_tensor), packed
constexpr size_t kGetTensorSizeAt = kRpcTensorBytes + 8;   // after the tensor and the offset
constexpr std::array<uint8_t, 4> kProtocol = {7, 0, 0, 0}; // HELLO's answer when answering alone
// In rpc_tensor: type u32 at 8, ne u32[4] at 20, nb u32[4] at 36. GET_ALLOC_SIZE's request holds
// a u32 device, then the tensor.
constexpr size_t kTypeAt = 8, kNeAt = 20, kNbAt = 36, kAllocSizeTensorAt = 4;

// The answers given for a server that is gone: what lets the client go on without aborting and
// without breaking the allocator's invariants. A buffer allocation fails (remote pointer 0);
// a tensor's allocation size is its ggml_nbytes, computed from the request; other sizes and
// data are zeros, except an alignment, a maximum size and a base pointer that are never 0.
void own_answer(uint8_t cmd, const uint8_t *request, uint8_t *out, size_t n) {
  std::fill(out, out + n, 0);
  uint64_t v = 0;
  switch (cmd) {
  case kGetAlignment:
    v = 64;
    break;
  case kGetMaxSize:
    v = uint64_t(1) << 40;
    break;
  case kBufferGetBase:
    v = 4096;
    break;
  case kGetAllocSize: {
    const uint8_t *t = request + kAllocSizeTensorAt;
    uint32_t type = 0, ne[4], nb[4];
    std::memcpy(&type, t + kTypeAt, 4);
    std::memcpy(ne, t + kNeAt, sizeof ne);
    std::memcpy(nb, t + kNbAt, sizeof nb);
    if (type >= GGML_TYPE_COUNT || ggml_type_size(ggml_type(type)) == 0) break;
    const int64_t blck = ggml_blck_size(ggml_type(type));
    v = blck == 1 ? ggml_type_size(ggml_type(type)) : uint64_t(ne[0]) * nb[0] / uint64_t(blck);
    for (int i = blck == 1 ? 0 : 1; i < 4; ++i)
      if (ne[i] > 0) v += uint64_t(ne[i] - 1) * nb[i];
    break;
  }
  case kHello:
    std::memcpy(out, kProtocol.data(), kProtocol.size());
    return;
  default:
    return;
  }
  if (n >= 8) std::memcpy(out, &v, 8);
}

const char *cmd_name(uint8_t cmd) {
  static const char *names[] = {
      "ALLOC_BUFFER",  "GET_ALIGNMENT",     "GET_MAX_SIZE",    "BUFFER_GET_BASE", "FREE_BUFFER",
      "BUFFER_CLEAR",  "SET_TENSOR",        "SET_TENSOR_HASH", "GET_TENSOR",      "COPY_TENSOR",
      "GRAPH_COMPUTE", "GET_DEVICE_MEMORY", "INIT_TENSOR",     "GET_ALLOC_SIZE",  "HELLO",
      "DEVICE_COUNT",  "GRAPH_RECOMPUTE",   "MEMSET_TENSOR"};
  return cmd < kCmdCount ? names[cmd] : "an idle moment";
}

bool read_full(int fd, void *buf, size_t n) {
  auto *p = static_cast<uint8_t *>(buf);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    p += r, n -= size_t(r);
  }
  return true;
}

bool write_full(int fd, const void *buf, size_t n) {
  const auto *p = static_cast<const uint8_t *>(buf);
  while (n > 0) {
    const ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    p += r, n -= size_t(r);
  }
  return true;
}

void no_delay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// A connection to the server that breaks, rather than hangs, when the server's machine vanishes
// without closing it: keepalive probes after 10 s of silence (a server computing a long step
// still answers them: its kernel does), and unacknowledged data given up on after 30 s.
int connect_to(const sockaddr_in &address) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr *>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  no_delay(fd);
  int on = 1, idle = 10, interval = 5, count = 3;
  unsigned timeout_ms = 30000;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof(timeout_ms));
  return fd;
}

// A receive timeout on `fd` (0: none).
void receive_timeout(int fd, int seconds) {
  timeval tv{seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

// ggml-rpc-server answers one client at a time: a handshake unanswered after this long means it
// is serving another (ggml-rpc's client would wait for ever).
constexpr int kHelloSeconds = 10;

} // namespace

std::unique_ptr<RpcRelay> RpcRelay::start(const sockaddr_in &address, std::string *error) {
  std::unique_ptr<RpcRelay> r(new RpcRelay());
  r->server_ = address;
  r->listener_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (r->listener_ < 0 || bind(r->listener_, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) != 0 ||
      listen(r->listener_, 4) != 0 ||
      getsockname(r->listener_, reinterpret_cast<sockaddr *>(&sa), &len) != 0) {
    *error = std::string("cannot listen on 127.0.0.1 for the RPC relay: ") + std::strerror(errno);
    return nullptr;
  }
  r->endpoint_ = "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  r->thread_ = std::thread([p = r.get()] { p->run(); });
  return r;
}

void RpcRelay::interrupt(const std::string &why) {
  fail(why);
  cut_server();
}

void RpcRelay::cut_server() {
  std::lock_guard lock(fd_mutex_);
  if (const int fd = server_fd_.load(); fd >= 0) shutdown(fd, SHUT_RDWR);
}

void RpcRelay::close_server(int &server) {
  std::lock_guard lock(fd_mutex_);
  server_fd_ = -1;
  if (server >= 0) close(server);
  server = -1;
}

RpcRelay::~RpcRelay() {
  stopping_ = true;
  if (listener_ >= 0) shutdown(listener_, SHUT_RDWR);
  cut_server(); // one that froze
  if (thread_.joinable()) thread_.join();
  if (listener_ >= 0) close(listener_);
}

std::string RpcRelay::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void RpcRelay::fail(const std::string &why) {
  std::lock_guard lock(mutex_);
  if (failed_) return;
  failure_ = why;
  failed_ = true;
}

void RpcRelay::run() {
  while (!stopping_) {
    pollfd p{listener_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int client = accept(listener_, nullptr, nullptr);
    if (client < 0) continue;
    no_delay(client);
    serve(client);
    close(client);
  }
}

void RpcRelay::serve(int client) {
  int server = failed_ ? -1 : connect_to(server_);
  if (server < 0 && !failed_) fail("cannot connect to the server");
  server_fd_ = server;
  auto lost = [&](uint8_t cmd, const std::string &how) {
    fail("the server " + how + " during " + cmd_name(cmd));
    close_server(server);
  };
  std::vector<uint8_t> chunk(1 << 20);
  // The last request forwarded that has no response (SET_TENSOR, GRAPH_COMPUTE, ...), until a
  // request with one is answered: a server that closes while the relay waits for the client's
  // next request is named after it (a step's requests end with GET_TENSOR's answer, so a server
  // that dies between steps is still "an idle moment").
  uint8_t unanswered = kCmdCount;
  for (;;) {
    // The client's next request, forwarded piece by piece while the server takes it.
    uint8_t cmd = 0;
    uint64_t size = 0;
    // Between requests: poll, so that a stopping relay ends, and so that a server that closes
    // its connection while idle (it never speaks unasked) is known gone before the next step.
    for (;;) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (poll(p, server >= 0 ? 2 : 1, 100) > 0) {
        if (p[0].revents) break;
        // A server never speaks unasked: readable while idle is a close, or bytes it had no
        // reason to send; both end it.
        if (server >= 0 && p[1].revents) {
          if (unanswered == kCmdCount)
            lost(kCmdCount, "closed the connection");
          else {
            // (Inside a step, between its requests: the server computing a graph, say.)
            fail(std::string("the server closed the connection after ") + cmd_name(unanswered) +
                 ", before the client's next request");
            close_server(server);
          }
        }
      }
      if (stopping_) {
        close_server(server);
        return;
      }
    }
    if (!read_full(client, &cmd, 1) || !read_full(client, &size, 8)) break;
    if (cmd == kFreeBuffer) ++buffer_frees_; // counted before forwarding: reuse checks it
    if (server >= 0 && (!write_full(server, &cmd, 1) || !write_full(server, &size, 8)))
      lost(cmd, "closed the connection");
    if (server >= 0) to_server_ += 9;
    std::array<uint8_t, kGetTensorSizeAt + 8> head{}; // the request's first bytes
    uint64_t left = size, at = 0;
    bool client_ok = true;
    while (left > 0) {
      const size_t n = size_t(std::min<uint64_t>(left, chunk.size()));
      if (!read_full(client, chunk.data(), n)) {
        client_ok = false;
        break;
      }
      if (at < head.size())
        std::memcpy(head.data() + at, chunk.data(), std::min<uint64_t>(n, head.size() - at));
      if (server >= 0 && !write_full(server, chunk.data(), n)) lost(cmd, "closed the connection");
      if (server >= 0) to_server_ += int64_t(n);
      left -= n, at += n;
    }
    if (!client_ok) break;
    int64_t expected = cmd < kCmdCount ? kResponseBytes[cmd] : -1;
    if (cmd == kGetTensor) {
      uint64_t asked = 0;
      std::memcpy(&asked, head.data() + kGetTensorSizeAt, 8);
      expected = int64_t(asked);
    }
    if (expected < 0) {
      unanswered = cmd;
      continue;
    }
    unanswered = kCmdCount;
    // Its response: the server's, or ours once it is gone (zeros of the size the client expects,
    // after whatever part of the server's already went out). A size the client does not expect
    // would make it abort: that server is treated as gone too.
    uint64_t rsize = uint64_t(expected);
    if (server >= 0 && cmd == kHello) receive_timeout(server, kHelloSeconds);
    if (server >= 0 && !read_full(server, &rsize, 8)) {
      lost(cmd, cmd == kHello ? "did not answer the handshake (is it serving another client?)"
                              : "closed the connection before answering");
      rsize = uint64_t(expected);
    } else if (server >= 0 && rsize != uint64_t(expected)) {
      lost(cmd, "answered " + std::to_string(rsize) + " bytes where ggml-rpc 7.0 answers " +
                    std::to_string(expected) + " (is it a ggml-rpc-server of the pinned tree?)");
      rsize = uint64_t(expected);
    }
    if (server >= 0) from_server_ += 8;
    if (!write_full(client, &rsize, 8)) break;
    left = rsize;
    bool own = server < 0;
    bool first = true; // own_answer fills the start of the response, then zeros
    while (left > 0) {
      const size_t n = size_t(std::min<uint64_t>(left, chunk.size()));
      if (!own && !read_full(server, chunk.data(), n)) {
        lost(cmd, "closed the connection while answering");
        own = true;
      }
      // A server of another protocol version: the client would abort on the handshake.
      if (!own && first && cmd == kHello && (chunk[0] != kProtocol[0] || chunk[1] > kProtocol[1])) {
        lost(cmd, "speaks ggml-rpc " + std::to_string(chunk[0]) + "." + std::to_string(chunk[1]) +
                      ", offgraph's client 7.0 (a ggml-rpc-server of the pinned tree is needed)");
        own = true;
      }
      if (own) {
        if (first)
          own_answer(cmd, head.data(), chunk.data(), n);
        else
          std::fill(chunk.begin(), chunk.begin() + long(n), 0);
      } else {
        from_server_ += int64_t(n);
      }
      first = false;
      if (!write_full(client, chunk.data(), n)) break;
      left -= n;
    }
    if (left > 0) break; // the client went away
    if (server >= 0 && cmd == kHello) receive_timeout(server, 0);
  }
  close_server(server);
}

} // namespace offgraph::model
