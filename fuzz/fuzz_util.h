// Shared by the fuzz targets: a property failure aborts (libFuzzer saves the input as a crash;
// the replay test of the same target fails), and helpers to cut the input into fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#define FUZZ_CHECK(cond, ...)                                                                      \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);         \
      std::fprintf(stderr, __VA_ARGS__);                                                           \
      std::fputc('\n', stderr);                                                                    \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)

namespace offgraph::fuzz {

// Consumes the input front to back; runs dry gracefully (zeros, empty strings).
class Input {
public:
  Input(const uint8_t *data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  size_t left() const { return size_ - pos_; }
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(byte()) << (8 * i);
    return v;
  }
  // Bytes up to the next `sep` (consumed) or the end.
  std::string until(uint8_t sep) {
    std::string out;
    while (pos_ < size_ && data_[pos_] != sep) out += char(data_[pos_++]);
    if (pos_ < size_) ++pos_;
    return out;
  }
  std::string rest() {
    std::string out(reinterpret_cast<const char *>(data_ + pos_), size_ - pos_);
    pos_ = size_;
    return out;
  }

private:
  const uint8_t *data_;
  size_t size_, pos_ = 0;
};

// The pinned llama.cpp tree (vocabularies, chat templates): the environment variable
// OFFGRAPH_LLAMA_TREE, else the tree this binary was configured with.
inline std::string llama_tree() {
  if (const char *env = std::getenv("OFFGRAPH_LLAMA_TREE"); env && *env) return env;
#ifdef OFFGRAPH_LLAMA_TREE
  return OFFGRAPH_LLAMA_TREE;
#else
  return "";
#endif
}

inline std::string read_file(const std::string &path) {
  std::string out;
  if (std::FILE *f = std::fopen(path.c_str(), "rb")) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

} // namespace offgraph::fuzz
