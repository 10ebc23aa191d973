// What the model layer's tests share: a per-process folder for generated files, and the relative
// error of one logits row against another.
#pragma once

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

namespace offgraph::model::testing {

// Generated files live in a per-process folder, removed when the process ends.
inline std::filesystem::path temp_dir() {
  namespace fs = std::filesystem;
  static struct Dir {
    fs::path path =
        fs::temp_directory_path() / ("offgraph-model-test-" + std::to_string(::getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } dir;
  return dir.path;
}

// ||a - b|| / ||b|| in double precision; infinite when either holds a non-finite value.
inline double rel_error(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

} // namespace offgraph::model::testing
