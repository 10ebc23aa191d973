// GgufFile: a GGUF file opened for reading. Checks the container before trusting it (our own walk
// of the header, metadata and tensor table, check_gguf_layout, before ggml's parser sees a byte;
// then that every tensor's data lies inside the file), brings the data into host memory read-only
// (model/weight_memory.h: anonymous huge pages or the file's mapping), and offers typed metadata
// lookups whose errors name the key, the expected type and the type found.
#pragma once

#include "base/status.h"
#include "model/weight_memory.h"

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "gguf.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace offgraph::model {

// What check_gguf_layout learned about a well-formed container.
struct GgufLayout {
  uint32_t version = 0;
  uint64_t n_kv = 0, n_tensors = 0;
  uint64_t alignment = 32;
  uint64_t data_offset = 0; // where the tensor data starts (aligned)
  uint64_t data_size = 0;   // bytes of tensor data the table describes, padding included
};

// Limits on what a GGUF file may claim. Real models stay far below them (Muse Glimmer 30B: ~730
// tensors, ~40 keys, a 202K-token vocabulary); with them, parsing a hostile file allocates at most
// a few times the size of its metadata, never what its counts claim.
inline constexpr uint64_t kGgufMaxKeys = uint64_t(1) << 16;
inline constexpr uint64_t kGgufMaxTensors = uint64_t(1) << 16;
inline constexpr uint64_t kGgufMaxArrayElements = uint64_t(1) << 22;
inline constexpr uint64_t kGgufMaxKeyLength = 65535; // the GGUF specification's limit

// Walks a GGUF container held in memory (at least everything before the tensor data): magic,
// version, counts, every key, type, string and array, and every tensor's name, shape, type and
// offset, each bounded by the bytes that are there and by the limits above, with the rules ggml's
// parser applies (no duplicate keys or tensor names, general.alignment a u32 power of two, tensors
// stored in table order, each aligned). Errors name the item at fault and its byte offset. Tensor
// data past the end is not an error here (metadata-only files); GgufFile::map_weights refuses it.
Result<GgufLayout> check_gguf_layout(const uint8_t *data, size_t size);

// Called with (bytes done, bytes total) while a large file is read in.
using Progress = std::function<void(uint64_t, uint64_t)>;

class GgufFile {
public:
  // Parses the header and tensor infos; maps nothing yet.
  static Result<std::unique_ptr<GgufFile>> open(const std::string &path);
  ~GgufFile();
  GgufFile(const GgufFile &) = delete;
  GgufFile &operator=(const GgufFile &) = delete;

  const std::string &path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  gguf_context *gguf() const { return gguf_.get(); }
  // Tensor infos as ggml tensors (shapes and types; data bound only after map_weights()).
  ggml_context *tensors() const { return meta_.get(); }
  ggml_tensor *tensor(const std::string &name) const;
  int64_t n_tensors() const;

  // True when every tensor's data lies inside the file (false for a metadata-only file).
  bool has_weights() const { return weights_missing_.empty(); }
  // Why not: the first tensor whose data lies past the end.
  const std::string &weights_missing() const { return weights_missing_; }

  // Brings the file's bytes into host memory (model/weight_memory.h: read into anonymous memory
  // in huge pages, or mapped) and binds every tensor to them in a CPU buffer; `progress` sees the
  // bytes read in (a mapping's pages are read in here too, so later steps do not fault).
  Status map_weights(const Progress &progress = nullptr, bool anonymous = false);
  bool weights_anonymous() const { return memory_.anonymous(); }
  bool weights_huge_pages_advised() const { return memory_.huge_pages_advised(); }

  // Typed metadata. `optional_*` return nullopt when the key is absent but fail on a wrong type.
  bool has(const std::string &key) const;
  Result<uint32_t> u32(const std::string &key) const;
  Result<float> f32(const std::string &key) const;
  Result<std::string> str(const std::string &key) const;
  Result<std::optional<uint32_t>> optional_u32(const std::string &key) const;
  Result<std::optional<float>> optional_f32(const std::string &key) const;
  Result<std::optional<bool>> optional_bool(const std::string &key) const;
  // A float array (f32 elements), or nullopt when the key is absent.
  Result<std::optional<std::vector<float>>> optional_f32_array(const std::string &key) const;
  // An integer array (any integer element type, values as int64), or nullopt when the key holds
  // a scalar or is absent.
  Result<std::optional<std::vector<int64_t>>> optional_int_array(const std::string &key) const;
  // A bool array, or nullopt when the key holds a scalar or is absent.
  Result<std::optional<std::vector<bool>>> optional_bool_array(const std::string &key) const;

private:
  GgufFile() = default;
  Result<int64_t> key_of(const std::string &key, std::initializer_list<gguf_type> accepted) const;

  std::string path_;
  uint64_t file_size_ = 0;
  gguf_context_ptr gguf_;
  ggml_context_ptr meta_;
  std::string weights_missing_;
  WeightMemory memory_;
  ggml_backend_buffer_ptr buffer_;
};

std::string gguf_type_label(gguf_type t);

} // namespace offgraph::model
