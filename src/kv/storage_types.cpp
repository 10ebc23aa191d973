#include "kv/storage_types.h"

namespace offgraph::kv {

namespace {

// Types ggml's CPU flash attention reads for K and V (it converts Q to K's dot type and V rows to
// f32). Others (k-quants, i-quants) have no such path.
constexpr struct {
  const char *name;
  ggml_type type;
} kSupported[] = {
    {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
    {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
    {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1},
};

bool supported(ggml_type t) {
  for (const auto &s : kSupported)
    if (s.type == t) return true;
  return false;
}

std::string accepted_list() {
  std::string s;
  for (const auto &x : kSupported) s += std::string(s.empty() ? "" : ", ") + x.name;
  return s;
}

} // namespace

Result<ggml_type> parse_storage_type(std::string_view name) {
  for (const auto &s : kSupported)
    if (name == s.name) return s.type;
  return Status::error("unknown KV cache type '" + std::string(name) +
                       "' (accepted: " + accepted_list() + ")");
}

std::string storage_type_name(ggml_type t) { return ggml_type_name(t); }

Status check_storage_types(const cache::Layout &layout, StorageTypes types) {
  for (auto [what, t] : {std::pair{"K", types.k}, std::pair{"V", types.v}}) {
    if (!supported(t))
      return Status::error(std::string(what) + " cache type " + ggml_type_name(t) +
                           " is not supported by attention (accepted: " + accepted_list() + ")");
  }
  for (cache::CacheId id = 0; id < layout.n_caches(); ++id) {
    const cache::CacheSpec &c = layout.cache(id).spec;
    for (auto [what, t, dim] :
         {std::tuple{"K", types.k, c.k_head_dim}, std::tuple{"V", types.v, c.v_head_dim}}) {
      const int64_t block = ggml_blck_size(t);
      if (dim % block != 0)
        return Status::error(std::string(what) + " cache type " + ggml_type_name(t) +
                             " stores blocks of " + std::to_string(block) + " values, but cache " +
                             std::to_string(id) + " has " + what + " head dim " +
                             std::to_string(dim));
    }
  }
  return ok_status();
}

size_t k_row_bytes(const cache::Layout &layout, cache::CacheId id, StorageTypes types) {
  return ggml_row_size(types.k, layout.cache(id).spec.k_elements_per_token());
}

size_t v_row_bytes(const cache::Layout &layout, cache::CacheId id, StorageTypes types) {
  return ggml_row_size(types.v, layout.cache(id).spec.v_elements_per_token());
}

} // namespace offgraph::kv
