// Where a model file's weights live in host memory: read into anonymous memory in 2 MiB pages
// (the default where the kernel offers transparent huge pages and the weights fit), or the
// file's own mapping (`--mmap`, or where they would not fit).
//
// Why: a decode step reads every weight once. Over the file's mapping (4 KiB pages of the page
// cache) every 4 KiB costs a TLB miss and a page walk in the middle of the stream; in 2 MiB pages
// q8_0 decode ran a fifth to a third faster on this project's Xeon (Gemma 4 E2B-like 23.6-24.2 ->
// 28.5-29.3 t/s, Muse Glimmer 0.4b 57.7-61.4 -> 75.3-78.4; docs/cpu-kernels.md). The mapping
// stays the choice where the weights would crowd the memory (the page cache can drop and re-read
// mapped pages; anonymous memory can only be swapped), where layers go to other devices (their
// host copy would only waste memory), where the kernel gives no huge pages, and on request
// (`--mmap`): processes serving one file then share its pages (deploy/replicas does).
#pragma once

#include "base/status.h"

#include <cstdint>
#include <functional>
#include <string>

namespace offgraph::model {

enum class WeightStorage { automatic, mapped, anonymous };

// Process-wide request (`--mmap` asks for `mapped`); models loaded afterwards follow it.
void set_weight_storage(WeightStorage storage);
WeightStorage weight_storage();

struct StorageChoice {
  bool anonymous = false;
  std::string why; // for logs: what was chosen and why
};

// What the choice weighs of a file: its size, and how many of its bytes are q8_0 tensors.
struct WeightBytes {
  uint64_t total = 0;
  uint64_t q8_0 = 0;
};

// Bytes this process may still take: /proc/meminfo's MemAvailable, less where a cgroup (v2, or
// v1's memory controller) limits the process to less (a container on a larger host). 0: unknown.
uint64_t available_memory();

// The choice for a file's weights: `asked` (the setting above), `mem_available` (bytes, from
// /proc/meminfo), `thp_enabled` (the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled,
// "" if unknown), `all_on_cpu` (no layer placed on another device). Anonymous memory by default
// when q8_0 tensors hold at least half of the bytes (where huge pages were measured to pay: q8_0
// decode reads at the memory's speed; f16 ran the same either way and q4_K 1-3% slower, its dot
// product being compute-bound, so those keep the shareable mapping), huge pages can be had, every
// layer computes on the CPU and the weights take at most half of the available memory
// (MemAvailable, or a cgroup's limit where lower): the rest is left to the K/V pool, which grows
// with the context.
StorageChoice choose_weight_storage(WeightBytes bytes, uint64_t mem_available,
                                    const std::string &thp_enabled, bool all_on_cpu,
                                    WeightStorage asked);
// The same, for this machine now.
StorageChoice choose_weight_storage(WeightBytes bytes, bool all_on_cpu);

// A file's bytes in memory, read-only: mapped, or read into anonymous 2 MiB-aligned memory
// advised for huge pages. Unmapped on destruction.
class WeightMemory {
public:
  // Called with (bytes done, bytes total) while an anonymous copy is read in (a mapping is read
  // in later, by its first reads: GgufFile::map_weights touches its pages with progress).
  using Progress = std::function<void(uint64_t, uint64_t)>;
  static Result<WeightMemory> load(const std::string &path, uint64_t size, bool anonymous,
                                   const Progress &progress);
  WeightMemory() = default;
  WeightMemory(WeightMemory &&other) noexcept;
  WeightMemory &operator=(WeightMemory &&other) noexcept;
  WeightMemory(const WeightMemory &) = delete;
  WeightMemory &operator=(const WeightMemory &) = delete;
  ~WeightMemory();

  void *data() const { return data_; }
  uint64_t size() const { return size_; }
  bool anonymous() const { return anonymous_; }
  // The kernel took the advice to back the anonymous copy with huge pages (it may still give
  // 4 KiB pages where it finds no free 2 MiB).
  bool huge_pages_advised() const { return huge_pages_advised_; }

private:
  void reset();
  void *data_ = nullptr;
  uint64_t size_ = 0;
  void *region_ = nullptr; // what munmap takes (the aligned anonymous region, or the mapping)
  uint64_t region_size_ = 0;
  bool anonymous_ = false;
  bool huge_pages_advised_ = false;
};

} // namespace offgraph::model
