// read_bandwidth: the memory's read speed for a working set of a given size, the floor a decode
// step's weight reads are held to (bench/cpu_kernels: decode t/s x weight bytes per step against
// it). Each thread reads its contiguous part of one buffer with the widest vector loads this
// build has (AVX-512 or AVX2: an XOR reduction), each cache line asked for a lead
// ahead with a software prefetch (none, 1, 2, 4 and 8 KiB: the hardware prefetcher alone
// leaves this project's Xeon at two thirds of its speed). The floor is the best of every lead
// and repetition, in 2 MiB pages where the kernel gives them: no kernel reads faster.
//
//     read_bandwidth --bytes N [--threads T] [--reps R]     # prints one JSON line
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kLineWords = 8; // 64 bytes

// XOR of n words (a multiple of four lines read a line-group at a time), each line `lead_words`
// ahead asked for first.
uint64_t read_part(const uint64_t *p, size_t n, size_t lead_words) {
  size_t i = 0;
  uint64_t out = 0;
#if defined(__AVX512F__)
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (; i + 4 * kLineWords <= n; i += 4 * kLineWords) {
    if (lead_words)
      for (size_t l = 0; l < 4; ++l) _mm_prefetch(p + i + lead_words + l * kLineWords, _MM_HINT_T0);
    a = _mm512_xor_si512(a, _mm512_loadu_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_loadu_si512(p + i + kLineWords));
    c = _mm512_xor_si512(c, _mm512_loadu_si512(p + i + 2 * kLineWords));
    d = _mm512_xor_si512(d, _mm512_loadu_si512(p + i + 3 * kLineWords));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d)));
  for (uint64_t v : lanes) out ^= v;
#elif defined(__AVX2__)
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (; i + 2 * kLineWords <= n; i += 2 * kLineWords) {
    if (lead_words)
      for (size_t l = 0; l < 2; ++l) _mm_prefetch(p + i + lead_words + l * kLineWords, _MM_HINT_T0);
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i + 4)));
    c = _mm256_xor_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i + 8)));
    d = _mm256_xor_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i + 12)));
  }
  const __m256i x = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  out = uint64_t(_mm256_extract_epi64(x, 0) ^ _mm256_extract_epi64(x, 1) ^
                 _mm256_extract_epi64(x, 2) ^ _mm256_extract_epi64(x, 3));
#else
  for (; i + kLineWords <= n; i += kLineWords) {
    if (lead_words) __builtin_prefetch(p + i + lead_words, 0, 3);
    for (size_t j = 0; j < kLineWords; ++j) out ^= p[i + j];
  }
#endif
  for (; i < n; ++i) out ^= p[i];
  return out;
}

int usage() {
  std::fprintf(stderr, "usage: read_bandwidth --bytes N [--threads T] [--reps R]\n");
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  long long bytes = 0;
  int threads = 2, reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    char *end = nullptr;
    const long long v = std::strtoll(argv[i + 1], &end, 10);
    if (*end != '\0' || v <= 0) return usage();
    if (a == "--bytes")
      bytes = v;
    else if (a == "--threads")
      threads = int(v);
    else if (a == "--reps")
      reps = int(v);
    else
      return usage();
  }
  if (bytes <= 0 || argc % 2 == 0) return usage();
  const size_t words = size_t(bytes) / 8;
  // In 2 MiB pages where the kernel gives them, as offgraph holds its weights
  // (src/model/weight_memory.h): 4 KiB pages cost a page walk every 4 KiB of the stream.
  const size_t huge = size_t(2) << 20, rounded = (words * 8 + huge - 1) / huge * huge;
  void *region = std::aligned_alloc(huge, rounded);
  if (!region) {
    std::fprintf(stderr, "read_bandwidth: cannot allocate %zu bytes\n", rounded);
    return 1;
  }
#if defined(MADV_HUGEPAGE)
  madvise(region, rounded, MADV_HUGEPAGE);
#endif
  struct Free {
    void *p;
    ~Free() { std::free(p); }
  } free_region{region};
  uint64_t *buffer = static_cast<uint64_t *>(region);
  for (size_t i = 0; i < words; ++i) buffer[i] = i * 0x9e3779b97f4a7c15ull; // paged in, not zeros
  double best = 1e30;
  long long best_lead = 0;
  uint64_t sink = 0;
  for (const long long lead : {0LL, 1024LL, 2048LL, 4096LL, 8192LL})
    for (int r = 0; r < reps; ++r) {
      std::vector<uint64_t> parts(static_cast<size_t>(threads));
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
          const size_t first = words * size_t(t) / size_t(threads);
          const size_t last = words * size_t(t + 1) / size_t(threads);
          parts[size_t(t)] = read_part(buffer + first, last - first, size_t(lead) / 8);
        });
      for (auto &th : pool) th.join();
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (s < best) best = s, best_lead = lead;
      for (uint64_t p : parts) sink ^= p;
    }
  std::printf("{\"bytes\":%lld,\"threads\":%d,\"reps\":%d,\"gb_per_s\":%.3f,\"lead\":%lld,"
              "\"check\":%llu}\n",
              (long long)words * 8, threads, reps, double(words * 8) / best / 1e9, best_lead,
              (unsigned long long)(sink & 0xff));
  return 0;
}
