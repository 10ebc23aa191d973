// Byte counts as people read them in messages and logs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace offgraph {

// "12.3 MiB": one decimal, so that a budget and what passes it by a little read apart.
inline std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / double(int64_t(1) << 20));
  return text;
}

} // namespace offgraph
