// ggml-rpc-server processes on 127.0.0.1 for a test: started on free ports, waited for until they
// accept connections, killed at the end. OFFGRAPH_RPC_SERVER is the binary (scripts/deps.sh builds
// it with the pinned ggml).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace offgraph::testing {

class RpcServers {
public:
  explicit RpcServers(int n) {
    for (int i = 0; i < n; ++i) start();
  }
  ~RpcServers() {
    for (size_t i = 0; i < pids_.size(); ++i) kill_server(i);
  }
  RpcServers(const RpcServers &) = delete;
  RpcServers &operator=(const RpcServers &) = delete;

  bool ok() const { return ok_; }
  std::string endpoint(size_t i) const { return "127.0.0.1:" + std::to_string(ports_[i]); }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < ports_.size(); ++i) out.push_back(endpoint(i));
    return out;
  }
  // Still running (not crashed): what a custom op sent to it would do is kill it.
  bool alive(size_t i) {
    if (pids_[i] <= 0) return false;
    int status = 0;
    return waitpid(pids_[i], &status, WNOHANG) == 0;
  }
  // Stopped (SIGSTOP): the connection stays open and TCP still acknowledges, nothing answers.
  void freeze(size_t i) {
    if (pids_[i] > 0) ::kill(pids_[i], SIGSTOP);
  }
  void kill_server(size_t i) {
    if (pids_[i] <= 0) return;
    ::kill(pids_[i], SIGKILL);
    waitpid(pids_[i], nullptr, 0);
    pids_[i] = -1;
  }

private:
  static int free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr *>(&sa), &len) == 0)
      port = ntohs(sa.sin_port);
    close(fd);
    return port;
  }
  static bool accepts(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(uint16_t(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) == 0;
    close(fd);
    return ok;
  }
  void start() {
    const int port = free_port();
    const std::string p = std::to_string(port);
    std::vector<std::string> args = {OFFGRAPH_RPC_SERVER, "-H", "127.0.0.1", "-p", p, "-t", "1"};
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      // The server dies with the test, even one that crashed before its destructors ran.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1), dup2(null, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const int r = pid > 0 ? 0 : -1;
    pids_.push_back(pid > 0 ? pid : -1);
    ports_.push_back(port);
    bool up = false;
    for (int i = 0; r == 0 && i < 200 && !up; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
      up = accepts(port);
    }
    ok_ = ok_ && up;
  }

  std::vector<pid_t> pids_;
  std::vector<int> ports_;
  bool ok_ = true;
};

} // namespace offgraph::testing
