#include "server/connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace offgraph::server {

namespace {

uint16_t port_of(const sockaddr_storage &a) {
  return a.ss_family == AF_INET    ? ntohs(reinterpret_cast<const sockaddr_in &>(a).sin_port)
         : a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6 &>(a).sin6_port)
                                   : 0;
}

// The first of the process's descriptors for which `match(fd, local address)` holds; -1 if none.
template <typename Match> int find_socket(Match match) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent *entry = readdir(dir)) {
    char *end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end) continue;
    sockaddr_storage local{};
    socklen_t ll = sizeof local;
    if (getsockname(int(fd), reinterpret_cast<sockaddr *>(&local), &ll) != 0) continue;
    if (match(int(fd), local)) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

} // namespace

int connection_socket(int local_port, const std::string &remote_addr, int remote_port) {
  return find_socket([&](int fd, const sockaddr_storage &local) {
    sockaddr_storage peer{};
    socklen_t pl = sizeof peer;
    if (port_of(local) != local_port ||
        getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &pl) != 0 ||
        port_of(peer) != remote_port)
      return false;
    char text[INET6_ADDRSTRLEN] = {};
    if (peer.ss_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in &>(peer).sin_addr, text, sizeof text);
    else if (peer.ss_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 &>(peer).sin6_addr, text,
                sizeof text);
    return remote_addr == text;
  });
}

Status widen_listen_backlog(int local_port, int backlog) {
  // A listener on the port whose queue is still shorter: with SO_REUSEPORT (cpp-httplib sets it)
  // another server of this process may listen on the same port, already widened.
  const int fd = find_socket([&](int sock, const sockaddr_storage &local) {
    tcp_info info{};
    socklen_t len = sizeof info;
    return port_of(local) == local_port &&
           getsockopt(sock, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
           info.tcpi_state == TCP_LISTEN && int64_t(info.tcpi_sacked) < backlog;
  });
  if (fd < 0) return Status::error("no listening socket on port " + std::to_string(local_port));
  // Linux takes a second listen() on a listening socket as a new backlog (capped at
  // net.core.somaxconn).
  if (listen(fd, backlog) != 0)
    return Status::error("cannot set the listen backlog of port " + std::to_string(local_port) +
                         ": " + std::strerror(errno));
  return ok_status();
}

bool peer_closed(int sock) {
  if (sock < 0) return false;
  pollfd p{sock, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return true;
  if (p.revents & POLLIN) {
    char c;
    return recv(sock, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

} // namespace offgraph::server
