#include "model/arch.h"

namespace offgraph::model {

// The table: one row per architecture (each row is defined in the architecture's own file).
std::span<const Architecture *const> architectures() {
  static const Architecture *const rows[] = {&kMuseGlimmer, &kLlama, &kGemma4};
  return rows;
}

const Architecture *find_architecture(std::string_view name) {
  for (const Architecture *a : architectures())
    if (a->name == name) return a;
  return nullptr;
}

std::string architecture_names() {
  std::string s;
  for (const Architecture *a : architectures()) s += (s.empty() ? "" : ", ") + std::string(a->name);
  return s;
}

} // namespace offgraph::model
