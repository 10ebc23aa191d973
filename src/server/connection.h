// Sockets cpp-httplib 0.11 does not expose, found among the process's descriptors: a request's
// connection (whether its client is still there: a handler that waits for the engine polls it,
// server.cpp, every kPoll) and the listening socket (its backlog).
#pragma once

#include "base/status.h"

#include <string>

namespace offgraph::server {

// The socket of a request's connection, found by the connection's addresses among the process's
// descriptors; the connection stays open while its handler runs, so the descriptor cannot be
// reused meanwhile. -1 when not found.
int connection_socket(int local_port, const std::string &remote_addr, int remote_port);

// Sets the kernel's queue of connections not yet accepted on the process's socket listening on
// `local_port` to `backlog`: cpp-httplib 0.11 (Debian's, compiled) listens with 5, which a burst
// of clients overflows while its one accept thread is busy.
Status widen_listen_backlog(int local_port, int backlog);

// True once the peer closed its end (orderly or not). Pipelined bytes waiting to be read mean
// the client is still there.
bool peer_closed(int sock);

} // namespace offgraph::server
