#include "model/weight_memory.h"

#include "base/units.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <sys/mman.h>
#include <unistd.h>
#include <utility>

namespace offgraph::model {
namespace {

std::atomic<WeightStorage> g_storage{WeightStorage::automatic};

constexpr uint64_t kHugePage = uint64_t(2) << 20;
constexpr uint64_t kReadChunk = uint64_t(64) << 20; // bytes a read call asks for (progress)

// A cgroup file's one number ("max": unlimited). 0: unreadable.
uint64_t read_u64(const std::string &path, bool *unlimited = nullptr) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word)) return 0;
  if (word == "max") {
    if (unlimited) *unlimited = true;
    return 0;
  }
  try {
    return std::stoull(word);
  } catch (...) {
    return 0;
  }
}

// available_memory() (weight_memory.h).
uint64_t read_mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0, available = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") available = kib * 1024;
  std::ifstream groups("/proc/self/cgroup");
  for (std::string line; std::getline(groups, line);) {
    // v2: "0::/path"; v1: "N:memory:/path" (or with other controllers beside memory).
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::string limit_file, usage_file;
    if (controllers.empty()) {
      limit_file = "/sys/fs/cgroup" + path + "/memory.max";
      usage_file = "/sys/fs/cgroup" + path + "/memory.current";
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      limit_file = "/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes";
      usage_file = "/sys/fs/cgroup/memory" + path + "/memory.usage_in_bytes";
    } else {
      continue;
    }
    bool unlimited = false;
    const uint64_t limit = read_u64(limit_file, &unlimited), used = read_u64(usage_file);
    if (unlimited || limit == 0 || limit >= (uint64_t(1) << 60)) continue;
    const uint64_t left = limit > used ? limit - used : 0;
    if (available == 0 || left < available) available = left;
  }
  return available;
}

std::string thp_enabled() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return line.substr(open + 1, close - open - 1);
}

} // namespace

uint64_t available_memory() { return read_mem_available(); }

void set_weight_storage(WeightStorage storage) { g_storage = storage; }
WeightStorage weight_storage() { return g_storage; }

StorageChoice choose_weight_storage(WeightBytes weights, uint64_t available, const std::string &thp,
                                    bool all_on_cpu, WeightStorage asked) {
  if (asked == WeightStorage::mapped) return {false, "the file's mapping (--mmap)"};
  if (asked == WeightStorage::anonymous)
    return {true, "anonymous memory in 2 MiB pages (asked for)"};
  if (!all_on_cpu)
    return {false, "the file's mapping (layers on other devices: a host copy of theirs would "
                   "only take memory)"};
  if (weights.q8_0 * 2 < weights.total)
    return {false, "the file's mapping (q8_0 holds " + mib(weights.q8_0) + " of its " +
                       mib(weights.total) + ": huge pages speed up q8_0 decode, not the others)"};
  if (thp != "always" && thp != "madvise")
    return {false, "the file's mapping (the kernel offers no transparent huge pages" +
                       (thp.empty() ? std::string() : ": '" + thp + "'") + ")"};
  // At most half of what is available: the rest for the K/V pool (which grows with the
  // context), the graphs and the other processes; the page cache can drop and re-read mapped
  // weights under pressure, anonymous ones can only swap.
  const uint64_t bytes = weights.total;
  if (available == 0) return {false, "the file's mapping (the available memory is unknown)"};
  if (bytes > available / 2)
    return {false, "the file's mapping (" + mib(bytes) + " of weights against " + mib(available) +
                       " available: anonymous memory would crowd it)"};
  return {true, "anonymous memory in 2 MiB pages (" + mib(bytes) + " of " + mib(available) +
                    " available)"};
}

StorageChoice choose_weight_storage(WeightBytes bytes, bool all_on_cpu) {
  return choose_weight_storage(bytes, available_memory(), thp_enabled(), all_on_cpu, g_storage);
}

Result<WeightMemory> WeightMemory::load(const std::string &path, uint64_t size, bool anonymous,
                                        const Progress &progress) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return Status::error(path + ": cannot open (" + std::strerror(errno) + ")");
  if (size == 0) {
    ::close(fd);
    return Status::error(path + ": no bytes to load");
  }
  WeightMemory w;
  w.size_ = size;
  w.anonymous_ = anonymous;
  if (!anonymous) {
    void *m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) return Status::error(path + ": cannot map (" + std::strerror(errno) + ")");
    w.region_ = w.data_ = m, w.region_size_ = size;
    return w;
  }
  // A region of whole huge pages starting on one: the slack before and after is given back.
  const uint64_t rounded = (size + kHugePage - 1) / kHugePage * kHugePage;
  void *m = mmap(nullptr, rounded + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (m == MAP_FAILED) {
    ::close(fd);
    return Status::error(path + ": cannot allocate " + mib(size) + " for the weights (" +
                         std::strerror(errno) + "); --mmap maps the file instead");
  }
  auto *base = static_cast<char *>(m);
  const uint64_t head = (kHugePage - reinterpret_cast<uintptr_t>(base) % kHugePage) % kHugePage;
  if (head > 0) munmap(base, head);
  munmap(base + head + rounded, kHugePage - head);
  w.region_ = w.data_ = base + head, w.region_size_ = rounded;
#if defined(MADV_HUGEPAGE)
  w.huge_pages_advised_ = madvise(w.region_, rounded, MADV_HUGEPAGE) == 0;
#endif
  for (uint64_t at = 0; at < size;) {
    const uint64_t want = size - at < kReadChunk ? size - at : kReadChunk;
    const ssize_t got = pread(fd, static_cast<char *>(w.data_) + at, want, off_t(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const std::string why = got < 0 ? std::strerror(errno) : "the file ended early";
      ::close(fd);
      return Status::error(path + ": cannot read bytes " + std::to_string(at) + ".." +
                           std::to_string(at + want) + " (" + why + ")");
    }
    at += uint64_t(got);
    if (progress) progress(at, size);
  }
  ::close(fd);
  // Read-only from here, as the mapping is: a stray write is a fault, not a changed weight.
  if (mprotect(w.region_, rounded, PROT_READ) != 0)
    return Status::error(path + ": cannot make the weights read-only (" + std::strerror(errno) +
                         ")");
  return w;
}

WeightMemory::WeightMemory(WeightMemory &&other) noexcept { *this = std::move(other); }

WeightMemory &WeightMemory::operator=(WeightMemory &&other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    region_ = std::exchange(other.region_, nullptr);
    region_size_ = std::exchange(other.region_size_, 0);
    anonymous_ = std::exchange(other.anonymous_, false);
    huge_pages_advised_ = std::exchange(other.huge_pages_advised_, false);
  }
  return *this;
}

WeightMemory::~WeightMemory() { reset(); }

void WeightMemory::reset() {
  if (region_) munmap(region_, region_size_);
  region_ = data_ = nullptr;
  region_size_ = size_ = 0;
  anonymous_ = huge_pages_advised_ = false;
}

} // namespace offgraph::model
