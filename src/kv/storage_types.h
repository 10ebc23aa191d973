// Storage dtypes of the K and V caches, chosen separately, and the byte arithmetic that follows
// from them. The output of attention is always f32, whatever is stored.
#pragma once

#include "base/status.h"
#include "cache/layout.h"

#include "ggml.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

namespace offgraph::kv {

struct StorageTypes {
  ggml_type k = GGML_TYPE_F16;
  ggml_type v = GGML_TYPE_F16;
};

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1" -> the ggml type; anything else is
// an error naming what is accepted.
Result<ggml_type> parse_storage_type(std::string_view name);
std::string storage_type_name(ggml_type t);

// Checks that every cache of the layout can be stored with these types: a supported type, and a
// head dim that is a whole number of the type's blocks (quantized rows are per head).
Status check_storage_types(const cache::Layout &layout, StorageTypes types);

// Bytes of one token's K (all KV heads) and V rows of cache `id`.
size_t k_row_bytes(const cache::Layout &layout, cache::CacheId id, StorageTypes types);
size_t v_row_bytes(const cache::Layout &layout, cache::CacheId id, StorageTypes types);

} // namespace offgraph::kv
