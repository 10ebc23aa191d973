#include "model/gguf_file.h"

#include "ggml-cpu.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace offgraph::model {

std::string gguf_type_label(gguf_type t) {
  switch (t) {
  case GGUF_TYPE_UINT8:
    return "u8";
  case GGUF_TYPE_INT8:
    return "i8";
  case GGUF_TYPE_UINT16:
    return "u16";
  case GGUF_TYPE_INT16:
    return "i16";
  case GGUF_TYPE_UINT32:
    return "u32";
  case GGUF_TYPE_INT32:
    return "i32";
  case GGUF_TYPE_FLOAT32:
    return "f32";
  case GGUF_TYPE_BOOL:
    return "bool";
  case GGUF_TYPE_STRING:
    return "string";
  case GGUF_TYPE_ARRAY:
    return "array";
  case GGUF_TYPE_UINT64:
    return "u64";
  case GGUF_TYPE_INT64:
    return "i64";
  case GGUF_TYPE_FLOAT64:
    return "f64";
  default:
    return "unknown type " + std::to_string(int(t));
  }
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string &path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    return Status::error(path + ": cannot open (" + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) return Status::error(path + ": not a regular file");
  f->file_size_ = uint64_t(st.st_size);
  // Check the container's first bytes ourselves, so the common mistakes get a precise message.
  {
    std::FILE *fp = std::fopen(path.c_str(), "rb");
    if (!fp) return Status::error(path + ": cannot open (" + std::strerror(errno) + ")");
    unsigned char head[8] = {};
    const size_t n = std::fread(head, 1, sizeof head, fp);
    std::fclose(fp);
    if (n < 8)
      return Status::error(path + ": too short to be a GGUF file (" + std::to_string(n) +
                           " bytes)");
    if (std::memcmp(head, "GGUF", 4) != 0)
      return Status::error(path + ": not a GGUF file (it starts with bytes other than 'GGUF')");
    const uint32_t version = uint32_t(head[4]) | uint32_t(head[5]) << 8 | uint32_t(head[6]) << 16 |
                             uint32_t(head[7]) << 24;
    if (version != 2 && version != 3)
      return Status::error(path + ": GGUF version " + std::to_string(version) +
                           " is not supported (2 or 3)");
  }
  ggml_context *meta = nullptr;
  gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/&meta};
  f->gguf_.reset(gguf_init_from_file(path.c_str(), params));
  if (!f->gguf_)
    return Status::error(path + ": malformed GGUF (the header, metadata or tensor table is "
                                "inconsistent or truncated)");
  f->meta_.reset(meta);
  const size_t data = gguf_get_data_offset(f->gguf_.get());
  for (int64_t i = 0; i < gguf_get_n_tensors(f->gguf_.get()); ++i) {
    const char *name = gguf_get_tensor_name(f->gguf_.get(), i);
    const uint64_t begin = data + gguf_get_tensor_offset(f->gguf_.get(), i);
    const uint64_t size = gguf_get_tensor_size(f->gguf_.get(), i);
    if (begin > f->file_size_ || size > f->file_size_ - begin) {
      f->weights_missing_ = std::string("tensor '") + name + "' needs bytes " +
                            std::to_string(begin) + ".." + std::to_string(begin + size) +
                            " but the file has " + std::to_string(f->file_size_);
      break;
    }
  }
  return f;
}

GgufFile::~GgufFile() {
  buffer_.reset();
  if (map_) munmap(map_, file_size_);
}

ggml_tensor *GgufFile::tensor(const std::string &name) const {
  return ggml_get_tensor(meta_.get(), name.c_str());
}

int64_t GgufFile::n_tensors() const { return gguf_get_n_tensors(gguf_.get()); }

Status GgufFile::map_weights(const Progress &progress) {
  if (!has_weights())
    return Status::error(path_ + ": the file holds no weights (" + weights_missing_ + ")");
  if (map_) return ok_status();
  const int fd = ::open(path_.c_str(), O_RDONLY);
  if (fd < 0) return Status::error(path_ + ": cannot open (" + std::strerror(errno) + ")");
  void *m = mmap(nullptr, file_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return Status::error(path_ + ": cannot map (" + std::strerror(errno) + ")");
  map_ = m;
  // ggml never writes weights; the CPU buffer only needs an address range.
  buffer_.reset(ggml_backend_cpu_buffer_from_ptr(map_, file_size_));
  if (!buffer_) return Status::error(path_ + ": cannot wrap the mapping in a ggml buffer");
  ggml_backend_buffer_set_usage(buffer_.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
  const size_t data = gguf_get_data_offset(gguf_.get());
  for (int64_t i = 0; i < n_tensors(); ++i) {
    ggml_tensor *t = tensor(gguf_get_tensor_name(gguf_.get(), i));
    char *addr = static_cast<char *>(map_) + data + gguf_get_tensor_offset(gguf_.get(), i);
    if (ggml_backend_tensor_alloc(buffer_.get(), t, addr) != GGML_STATUS_SUCCESS)
      return Status::error(path_ + ": cannot bind tensor '" + t->name + "'");
  }
  if (progress) {
    // Touch one byte a page so the reads happen here, with progress, not in the first step.
    const long page = sysconf(_SC_PAGESIZE);
    const volatile char *p = static_cast<const char *>(map_);
    const uint64_t chunk = uint64_t(64) << 20;
    char sink = 0;
    for (uint64_t at = 0; at < file_size_;) {
      const uint64_t end = std::min(file_size_, at + chunk);
      for (; at < end; at += uint64_t(page)) sink ^= p[at];
      progress(at, file_size_);
    }
    (void)sink;
  }
  return ok_status();
}

bool GgufFile::has(const std::string &key) const {
  return gguf_find_key(gguf_.get(), key.c_str()) >= 0;
}

Result<int64_t> GgufFile::key_of(const std::string &key,
                                 std::initializer_list<gguf_type> accepted) const {
  const int64_t id = gguf_find_key(gguf_.get(), key.c_str());
  if (id < 0) return Status::error(path_ + ": required key '" + key + "' is missing");
  const gguf_type t = gguf_get_kv_type(gguf_.get(), id);
  for (gguf_type a : accepted)
    if (t == a) return id;
  std::string want;
  for (gguf_type a : accepted) want += (want.empty() ? "" : " or ") + gguf_type_label(a);
  return Status::error(path_ + ": key '" + key + "' should be " + want + " but is " +
                       gguf_type_label(t));
}

Result<uint32_t> GgufFile::u32(const std::string &key) const {
  auto id = key_of(key, {GGUF_TYPE_UINT32, GGUF_TYPE_INT32, GGUF_TYPE_UINT64, GGUF_TYPE_INT64,
                         GGUF_TYPE_UINT16, GGUF_TYPE_UINT8});
  if (!id.ok()) return id.status();
  int64_t v = 0;
  switch (gguf_get_kv_type(gguf_.get(), *id)) {
  case GGUF_TYPE_UINT32:
    v = gguf_get_val_u32(gguf_.get(), *id);
    break;
  case GGUF_TYPE_INT32:
    v = gguf_get_val_i32(gguf_.get(), *id);
    break;
  case GGUF_TYPE_UINT64:
    v = int64_t(std::min<uint64_t>(gguf_get_val_u64(gguf_.get(), *id), uint64_t(1) << 40));
    break;
  case GGUF_TYPE_INT64:
    v = gguf_get_val_i64(gguf_.get(), *id);
    break;
  case GGUF_TYPE_UINT16:
    v = gguf_get_val_u16(gguf_.get(), *id);
    break;
  default:
    v = gguf_get_val_u8(gguf_.get(), *id);
    break;
  }
  if (v < 0 || v > int64_t(UINT32_MAX))
    return Status::error(path_ + ": key '" + key + "' = " + std::to_string(v) + " is out of range");
  return uint32_t(v);
}

Result<float> GgufFile::f32(const std::string &key) const {
  auto id = key_of(key, {GGUF_TYPE_FLOAT32, GGUF_TYPE_FLOAT64});
  if (!id.ok()) return id.status();
  return gguf_get_kv_type(gguf_.get(), *id) == GGUF_TYPE_FLOAT32
             ? gguf_get_val_f32(gguf_.get(), *id)
             : float(gguf_get_val_f64(gguf_.get(), *id));
}

Result<std::string> GgufFile::str(const std::string &key) const {
  auto id = key_of(key, {GGUF_TYPE_STRING});
  if (!id.ok()) return id.status();
  return std::string(gguf_get_val_str(gguf_.get(), *id));
}

Result<std::optional<uint32_t>> GgufFile::optional_u32(const std::string &key) const {
  if (!has(key)) return std::optional<uint32_t>();
  auto v = u32(key);
  if (!v.ok()) return v.status();
  return std::optional<uint32_t>(*v);
}

Result<std::optional<float>> GgufFile::optional_f32(const std::string &key) const {
  if (!has(key)) return std::optional<float>();
  auto v = f32(key);
  if (!v.ok()) return v.status();
  return std::optional<float>(*v);
}

Result<std::optional<std::vector<bool>>>
GgufFile::optional_bool_array(const std::string &key) const {
  const int64_t id = gguf_find_key(gguf_.get(), key.c_str());
  if (id < 0 || gguf_get_kv_type(gguf_.get(), id) != GGUF_TYPE_ARRAY)
    return std::optional<std::vector<bool>>();
  const gguf_type et = gguf_get_arr_type(gguf_.get(), id);
  if (et != GGUF_TYPE_BOOL && et != GGUF_TYPE_UINT8 && et != GGUF_TYPE_INT8 &&
      et != GGUF_TYPE_INT32 && et != GGUF_TYPE_UINT32)
    return Status::error(path_ + ": key '" + key + "' is an array of " + gguf_type_label(et) +
                         ", expected an array of bool");
  const size_t n = gguf_get_arr_n(gguf_.get(), id);
  const auto *raw = static_cast<const uint8_t *>(gguf_get_arr_data(gguf_.get(), id));
  const size_t width = (et == GGUF_TYPE_INT32 || et == GGUF_TYPE_UINT32) ? 4 : 1;
  std::vector<bool> out(n);
  for (size_t i = 0; i < n; ++i) {
    bool any = false;
    for (size_t b = 0; b < width; ++b) any = any || raw[i * width + b] != 0;
    out[i] = any;
  }
  return std::optional<std::vector<bool>>(std::move(out));
}

} // namespace offgraph::model
