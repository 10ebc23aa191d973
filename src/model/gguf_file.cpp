#include "model/gguf_file.h"

#include "ggml-cpu.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <string_view>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_set>

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

namespace {

// Bytes of one value of a scalar GGUF type; 0 for strings, arrays and unknown types.
uint64_t scalar_size(uint32_t t) {
  switch (t) {
  case GGUF_TYPE_UINT8:
  case GGUF_TYPE_INT8:
  case GGUF_TYPE_BOOL:
    return 1;
  case GGUF_TYPE_UINT16:
  case GGUF_TYPE_INT16:
    return 2;
  case GGUF_TYPE_UINT32:
  case GGUF_TYPE_INT32:
  case GGUF_TYPE_FLOAT32:
    return 4;
  case GGUF_TYPE_UINT64:
  case GGUF_TYPE_INT64:
  case GGUF_TYPE_FLOAT64:
    return 8;
  default:
    return 0;
  }
}

// Reads a GGUF container front to back; every read is bounded by the bytes left.
class Cursor {
public:
  Cursor(const uint8_t *data, size_t size) : data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  template <class T> bool get(T &v) {
    if (left() < sizeof(T)) return false;
    std::memcpy(&v, data_ + pos_, sizeof(T)); // GGUF is little-endian, as are our hosts
    pos_ += sizeof(T);
    return true;
  }
  bool skip(uint64_t n) {
    if (left() < n) return false;
    pos_ += n;
    return true;
  }
  std::string_view view(uint64_t n) const {
    return {reinterpret_cast<const char *>(data_ + pos_), size_t(n)};
  }

  Status truncated(const std::string &what) const {
    return Status::error("malformed GGUF: truncated, the file ends inside " + what + " (at byte " +
                         std::to_string(pos_) + " of " + std::to_string(size_) + ")");
  }
  // A length-prefixed string of at most `limit` bytes, which must lie in the file.
  Status string(std::string_view &out, const std::string &what, uint64_t limit) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    if (!get(len)) return truncated("the length of " + what);
    if (len > limit)
      return Status::error("malformed GGUF: " + what + " is " + std::to_string(len) +
                           " bytes long (at byte " + std::to_string(at) + "); at most " +
                           std::to_string(limit) + " are accepted");
    if (len > left())
      return Status::error("malformed GGUF: " + what + " claims " + std::to_string(len) +
                           " bytes (at byte " + std::to_string(at) + ") but only " +
                           std::to_string(left()) + " follow");
    out = view(len);
    pos_ += len;
    return ok_status();
  }

private:
  const uint8_t *data_;
  uint64_t size_, pos_ = 0;
};

Status bad(const std::string &what) { return Status::error("malformed GGUF: " + what); }

std::string quoted(std::string_view s) {
  std::string out = "'";
  for (char ch : s.substr(0, 80)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return out + (s.size() > 80 ? "...'" : "'");
}

// a + b and a * b within 64 bits, or false.
bool add_to(uint64_t &a, uint64_t b) { return !__builtin_add_overflow(a, b, &a); }
bool pad_to(uint64_t &x, uint64_t align) {
  const uint64_t rem = x % align;
  return rem == 0 || add_to(x, align - rem);
}

constexpr uint64_t kMaxStringBytes = uint64_t(1) << 30;
constexpr int64_t kMaxElements = int64_t(1) << 60;

} // namespace

Result<GgufLayout> check_gguf_layout(const uint8_t *data, size_t size) {
  Cursor c(data, size);
  GgufLayout out;
  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0)
    return Status::error("not a GGUF file (it does not start with 'GGUF')");
  (void)c.skip(4);
  if (!c.get(out.version)) return c.truncated("the header");
  if (out.version != 2 && out.version != 3)
    return Status::error("GGUF version " + std::to_string(out.version) +
                         " is not supported (2 or 3)");
  if (!c.get(out.n_tensors) || !c.get(out.n_kv)) return c.truncated("the header");
  if (out.n_tensors > kGgufMaxTensors)
    return bad("the header claims " + std::to_string(out.n_tensors) + " tensors; at most " +
               std::to_string(kGgufMaxTensors) + " are accepted");
  if (out.n_kv > kGgufMaxKeys)
    return bad("the header claims " + std::to_string(out.n_kv) + " metadata keys; at most " +
               std::to_string(kGgufMaxKeys) + " are accepted");
  // The smallest key takes 14 bytes (length, one character, type, one byte of value), the
  // smallest tensor entry 25 (length, one character, n_dims, type, offset).
  if (out.n_kv * 14 + out.n_tensors * 25 > c.left())
    return bad("the header claims " + std::to_string(out.n_kv) + " keys and " +
               std::to_string(out.n_tensors) + " tensors, more than the " +
               std::to_string(c.left()) + " bytes that follow can hold");

  std::unordered_set<std::string_view> keys;
  keys.reserve(size_t(out.n_kv));
  for (uint64_t i = 0; i < out.n_kv; ++i) {
    const uint64_t at = c.pos();
    std::string_view key;
    if (Status s = c.string(key, "the name of key #" + std::to_string(i), kGgufMaxKeyLength);
        !s.ok())
      return s;
    if (key.empty()) return bad("key #" + std::to_string(i) + " has an empty name");
    const std::string k = quoted(key);
    // C readers (ggml's lookups among them) see a name only up to its first NUL byte.
    if (key.find('\0') != std::string_view::npos)
      return bad("key " + k + " has a NUL byte in its name (at byte " +
                 std::to_string(at + 8 + key.find('\0')) + ")");
    if (!keys.insert(key).second)
      return bad("key " + k + " appears twice (again at byte " + std::to_string(at) + ")");
    uint32_t type = 0;
    if (!c.get(type)) return c.truncated("the type of key " + k);
    if (type >= GGUF_TYPE_COUNT)
      return bad("key " + k + " has unknown value type " + std::to_string(type));
    const bool is_alignment = key == GGUF_KEY_GENERAL_ALIGNMENT;
    if (is_alignment && type != GGUF_TYPE_UINT32)
      return bad("key '" GGUF_KEY_GENERAL_ALIGNMENT "' must be u32 but is " +
                 gguf_type_label(gguf_type(type)));
    if (type == GGUF_TYPE_ARRAY) {
      uint32_t elem = 0;
      uint64_t n = 0;
      if (!c.get(elem) || !c.get(n)) return c.truncated("the array header of key " + k);
      if (elem == GGUF_TYPE_ARRAY)
        return bad("key " + k + " is an array of arrays, which GGUF readers do not support");
      if (elem >= GGUF_TYPE_COUNT)
        return bad("key " + k + " is an array of unknown type " + std::to_string(elem));
      if (n > kGgufMaxArrayElements)
        return bad("key " + k + " claims " + std::to_string(n) + " elements; at most " +
                   std::to_string(kGgufMaxArrayElements) + " are accepted");
      const uint64_t min_bytes = n * (elem == GGUF_TYPE_STRING ? 8 : scalar_size(elem));
      if (min_bytes > c.left())
        return bad("key " + k + " claims " + std::to_string(n) + " elements of type " +
                   gguf_type_label(gguf_type(elem)) + " (at least " + std::to_string(min_bytes) +
                   " bytes) but only " + std::to_string(c.left()) + " bytes follow");
      if (elem == GGUF_TYPE_STRING) {
        for (uint64_t j = 0; j < n; ++j) {
          std::string_view v;
          if (Status s =
                  c.string(v, "element " + std::to_string(j) + " of key " + k, kMaxStringBytes);
              !s.ok())
            return s;
        }
      } else {
        (void)c.skip(min_bytes);
      }
    } else if (type == GGUF_TYPE_STRING) {
      std::string_view v;
      if (Status s = c.string(v, "the value of key " + k, kMaxStringBytes); !s.ok()) return s;
    } else {
      if (is_alignment) {
        uint32_t a = 0;
        if (!c.get(a)) return c.truncated("the value of key " + k);
        if (a == 0 || (a & (a - 1)) != 0)
          return bad("'" GGUF_KEY_GENERAL_ALIGNMENT "' = " + std::to_string(a) +
                     " is not a power of two");
        out.alignment = a;
      } else if (!c.skip(scalar_size(type))) {
        return c.truncated("the value of key " + k);
      }
    }
  }

  std::unordered_set<std::string_view> names;
  names.reserve(size_t(out.n_tensors));
  uint64_t expected = 0; // where the next tensor's data must start, relative to the data section
  for (uint64_t i = 0; i < out.n_tensors; ++i) {
    const uint64_t at = c.pos();
    std::string_view name;
    if (Status s = c.string(name, "the name of tensor #" + std::to_string(i), GGML_MAX_NAME - 1);
        !s.ok())
      return s;
    if (name.empty()) return bad("tensor #" + std::to_string(i) + " has an empty name");
    const std::string t = "tensor " + quoted(name);
    // ggml keeps a tensor's name up to its first NUL byte: two names that differ only after
    // one would become the same tensor there (found by the gguf fuzz target in CI).
    if (name.find('\0') != std::string_view::npos)
      return bad(t + " has a NUL byte in its name (at byte " +
                 std::to_string(at + 8 + name.find('\0')) + ")");
    if (!names.insert(name).second)
      return bad(t + " appears twice (again at byte " + std::to_string(at) + ")");
    uint32_t n_dims = 0;
    if (!c.get(n_dims)) return c.truncated("the shape of " + t);
    if (n_dims > GGML_MAX_DIMS)
      return bad(t + " has " + std::to_string(n_dims) + " dimensions; at most " +
                 std::to_string(GGML_MAX_DIMS) + " are supported");
    int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
    int64_t count = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (!c.get(ne[d])) return c.truncated("the shape of " + t);
      if (ne[d] < 0)
        return bad(t + " dimension " + std::to_string(d) + " is negative (" +
                   std::to_string(ne[d]) + ")");
    }
    for (int64_t n : ne) overflow = overflow || __builtin_mul_overflow(count, n, &count);
    std::string shape = "[";
    for (uint32_t d = 0; d < n_dims; ++d) shape += (d ? ", " : "") + std::to_string(ne[d]);
    shape += "]";
    if (overflow) return bad(t + " has shape " + shape + ", whose element count overflows 64 bits");
    if (count > kMaxElements)
      return bad(t + " has " + std::to_string(count) + " elements, more than 2^60");
    int32_t type = -1;
    if (!c.get(type)) return c.truncated("the type of " + t);
    if (type < 0 || type >= GGML_TYPE_COUNT || ggml_blck_size(ggml_type(type)) == 0)
      return bad(t + " has unknown ggml type " + std::to_string(type));
    const int64_t block = ggml_blck_size(ggml_type(type));
    if (ne[0] % block != 0)
      return bad(t + " has " + std::to_string(ne[0]) + " elements per row, not a multiple of " +
                 ggml_type_name(ggml_type(type)) + "'s block of " + std::to_string(block));
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(uint64_t(count / block), uint64_t(ggml_type_size(ggml_type(type))),
                               &bytes) ||
        !pad_to(bytes, out.alignment))
      return bad(t + " has shape " + shape + ", whose size in bytes overflows");
    uint64_t offset = 0;
    if (!c.get(offset)) return c.truncated("the data offset of " + t);
    if (offset % out.alignment != 0)
      return bad(t + " data offset " + std::to_string(offset) + " is not a multiple of the " +
                 "alignment " + std::to_string(out.alignment));
    if (offset != expected)
      return bad(t + " data offset " + std::to_string(offset) + " should be " +
                 std::to_string(expected) +
                 " (tensors are stored in table order, each padded to the alignment)");
    if (!add_to(expected, bytes)) return bad("the tensor data's total size overflows");
  }
  out.data_size = expected;
  out.data_offset = c.pos();
  if (!pad_to(out.data_offset, out.alignment) ||
      (out.n_tensors > 0 && out.data_offset > uint64_t(size)))
    return bad("the tensor data would start at byte " + std::to_string(out.data_offset) +
               ", past the end of the file (" + std::to_string(size) + " bytes)");
  uint64_t end = out.data_offset;
  if (!add_to(end, out.data_size)) return bad("the tensor data's end lies past 2^64 bytes");
  return out;
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
  // Our own walk of the container first: ggml's parser then sees only files whose counts,
  // lengths, shapes and offsets are bounded by the file, and a bad file gets a precise message.
  {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return Status::error(path + ": cannot open (" + std::strerror(errno) + ")");
    void *m = mmap(nullptr, f->file_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) return Status::error(path + ": cannot map (" + std::strerror(errno) + ")");
    auto layout = check_gguf_layout(static_cast<const uint8_t *>(m), f->file_size_);
    munmap(m, f->file_size_);
    if (!layout.ok()) return Status::error(path + ": " + layout.message());
  }
  ggml_context *meta = nullptr;
  gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/&meta};
  f->gguf_.reset(gguf_init_from_file(path.c_str(), params));
  if (!f->gguf_)
    return Status::error(path + ": malformed GGUF (ggml's parser refused what our check passed: "
                                "the header, metadata or tensor table is inconsistent)");
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

GgufFile::~GgufFile() { buffer_.reset(); }

ggml_tensor *GgufFile::tensor(const std::string &name) const {
  return ggml_get_tensor(meta_.get(), name.c_str());
}

int64_t GgufFile::n_tensors() const { return gguf_get_n_tensors(gguf_.get()); }

Status GgufFile::map_weights(const Progress &progress, bool anonymous) {
  if (!has_weights())
    return Status::error(path_ + ": the file holds no weights (" + weights_missing_ + ")");
  if (memory_.data()) return ok_status();
  auto loaded = WeightMemory::load(path_, file_size_, anonymous, progress);
  if (!loaded.ok()) return loaded.status();
  // Kept here until every tensor is bound: a failure leaves the file unloaded, not half.
  WeightMemory memory = std::move(loaded).value();
  // ggml never writes weights; the CPU buffer only needs an address range.
  ggml_backend_buffer_ptr buffer(ggml_backend_cpu_buffer_from_ptr(memory.data(), file_size_));
  if (!buffer) return Status::error(path_ + ": cannot wrap the weights in a ggml buffer");
  ggml_backend_buffer_set_usage(buffer.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
  const size_t data = gguf_get_data_offset(gguf_.get());
  for (int64_t i = 0; i < n_tensors(); ++i) {
    ggml_tensor *t = tensor(gguf_get_tensor_name(gguf_.get(), i));
    char *addr = static_cast<char *>(memory.data()) + data + gguf_get_tensor_offset(gguf_.get(), i);
    if (ggml_backend_tensor_alloc(buffer.get(), t, addr) != GGML_STATUS_SUCCESS)
      return Status::error(path_ + ": cannot bind tensor '" + t->name + "'");
  }
  memory_ = std::move(memory); // (the bytes stay where they are: the buffer's addresses hold)
  buffer_ = std::move(buffer);
  if (memory_.anonymous()) return ok_status(); // read in already
  // Touch one byte a page so the reads and page-table entries happen here (with progress), not
  // in the steps: an unmapped embedding row costs a page fault in the decode step that first
  // reads it (0.2 ms a step measured on a 0.4B model; llama.cpp maps with MAP_POPULATE).
  posix_madvise(memory_.data(), file_size_, POSIX_MADV_WILLNEED);
  const long page = sysconf(_SC_PAGESIZE);
  const volatile char *p = static_cast<const char *>(memory_.data());
  const uint64_t chunk = uint64_t(64) << 20;
  char sink = 0;
  for (uint64_t at = 0; at < file_size_;) {
    const uint64_t end = std::min(file_size_, at + chunk);
    for (; at < end; at += uint64_t(page)) sink ^= p[at];
    if (progress) progress(at, file_size_);
  }
  (void)sink;
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

Result<std::optional<bool>> GgufFile::optional_bool(const std::string &key) const {
  if (!has(key)) return std::optional<bool>();
  auto id = key_of(key, {GGUF_TYPE_BOOL});
  if (!id.ok()) return id.status();
  return std::optional<bool>(gguf_get_val_bool(gguf_.get(), *id));
}

Result<std::optional<std::vector<float>>>
GgufFile::optional_f32_array(const std::string &key) const {
  if (!has(key)) return std::optional<std::vector<float>>();
  auto id = key_of(key, {GGUF_TYPE_ARRAY});
  if (!id.ok()) return id.status();
  const gguf_type et = gguf_get_arr_type(gguf_.get(), *id);
  if (et != GGUF_TYPE_FLOAT32)
    return Status::error(path_ + ": key '" + key + "' is an array of " + gguf_type_label(et) +
                         ", expected an array of f32");
  const auto *raw = static_cast<const float *>(gguf_get_arr_data(gguf_.get(), *id));
  return std::optional<std::vector<float>>(
      std::vector<float>(raw, raw + gguf_get_arr_n(gguf_.get(), *id)));
}

Result<std::optional<std::vector<int64_t>>>
GgufFile::optional_int_array(const std::string &key) const {
  const int64_t id = gguf_find_key(gguf_.get(), key.c_str());
  if (id < 0 || gguf_get_kv_type(gguf_.get(), id) != GGUF_TYPE_ARRAY)
    return std::optional<std::vector<int64_t>>();
  const gguf_type et = gguf_get_arr_type(gguf_.get(), id);
  const size_t n = gguf_get_arr_n(gguf_.get(), id);
  const void *raw = gguf_get_arr_data(gguf_.get(), id);
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (et) {
    case GGUF_TYPE_UINT8:
      out[i] = static_cast<const uint8_t *>(raw)[i];
      break;
    case GGUF_TYPE_INT8:
      out[i] = static_cast<const int8_t *>(raw)[i];
      break;
    case GGUF_TYPE_UINT16:
      out[i] = static_cast<const uint16_t *>(raw)[i];
      break;
    case GGUF_TYPE_INT16:
      out[i] = static_cast<const int16_t *>(raw)[i];
      break;
    case GGUF_TYPE_UINT32:
      out[i] = static_cast<const uint32_t *>(raw)[i];
      break;
    case GGUF_TYPE_INT32:
      out[i] = static_cast<const int32_t *>(raw)[i];
      break;
    case GGUF_TYPE_INT64:
      out[i] = static_cast<const int64_t *>(raw)[i];
      break;
    case GGUF_TYPE_UINT64:
      out[i] =
          int64_t(std::min<uint64_t>(static_cast<const uint64_t *>(raw)[i], uint64_t(1) << 40));
      break;
    default:
      return Status::error(path_ + ": key '" + key + "' is an array of " + gguf_type_label(et) +
                           ", expected an array of integers");
    }
  }
  return std::optional<std::vector<int64_t>>(std::move(out));
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
