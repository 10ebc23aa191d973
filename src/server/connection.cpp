#include "server/connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace offgraph::server {

int connection_socket(int local_port, const std::string &remote_addr, int remote_port) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent *entry = readdir(dir)) {
    char *end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end) continue;
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof peer, ll = sizeof local;
    if (getpeername(int(fd), reinterpret_cast<sockaddr *>(&peer), &pl) != 0 ||
        getsockname(int(fd), reinterpret_cast<sockaddr *>(&local), &ll) != 0)
      continue;
    auto port_of = [](const sockaddr_storage &a) {
      return a.ss_family == AF_INET    ? ntohs(reinterpret_cast<const sockaddr_in &>(a).sin_port)
             : a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6 &>(a).sin6_port)
                                       : 0;
    };
    char text[INET6_ADDRSTRLEN] = {};
    if (peer.ss_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in &>(peer).sin_addr, text, sizeof text);
    else if (peer.ss_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 &>(peer).sin6_addr, text,
                sizeof text);
    if (port_of(local) == local_port && port_of(peer) == remote_port && remote_addr == text) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
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
