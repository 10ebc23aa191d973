// Whether a request's client is still there: cpp-httplib 0.11 does not say, so a handler that
// waits for the engine finds its connection's socket and polls it (server.cpp, every kPoll).
#pragma once

#include <string>

namespace offgraph::server {

// The socket of a request's connection, found by the connection's addresses among the process's
// descriptors; the connection stays open while its handler runs, so the descriptor cannot be
// reused meanwhile. -1 when not found.
int connection_socket(int local_port, const std::string &remote_addr, int remote_port);

// True once the peer closed its end (orderly or not). Pipelined bytes waiting to be read mean
// the client is still there.
bool peer_closed(int sock);

} // namespace offgraph::server
