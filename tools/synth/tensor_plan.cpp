#include "synth/tensor_plan.h"

#include "ggml-cpp.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>

namespace offgraph::synth {

ggml_type fit(ggml_type want, int64_t ne0) {
  for (ggml_type t : {want, GGML_TYPE_Q8_0, GGML_TYPE_F16})
    if (ne0 % ggml_blck_size(t) == 0) return t;
  return GGML_TYPE_F32;
}

Status write_gguf(gguf_context *keys, const std::vector<TensorPlan> &plan, const std::string &path,
                  bool metadata_only, uint64_t seed,
                  const std::function<void(uint64_t, uint64_t)> &progress, uint64_t &n_params,
                  uint64_t &total) {
  ggml_init_params params = {plan.size() * ggml_tensor_overhead(), nullptr, true};
  ggml_context_ptr meta(ggml_init(params));
  total = 0, n_params = 0;
  for (const TensorPlan &t : plan) {
    ggml_tensor *x = ggml_new_tensor(meta.get(), t.type, t.n_dims, t.ne.data());
    ggml_set_name(x, t.name.c_str());
    gguf_add_tensor(keys, x);
    total += ggml_nbytes(x);
    n_params += uint64_t(ggml_nelements(x));
  }
  std::FILE *fp = std::fopen(path.c_str(), "wb");
  if (!fp) return Status::error("synth: cannot write '" + path + "'");
  std::unique_ptr<std::FILE, int (*)(std::FILE *)> closer(fp, std::fclose);
  std::vector<uint8_t> head(gguf_get_meta_size(keys));
  gguf_get_meta_data(keys, head.data());
  if (std::fwrite(head.data(), 1, head.size(), fp) != head.size())
    return Status::error("synth: write failed");
  if (metadata_only) {
    if (std::fclose(closer.release()) != 0)
      return Status::error("synth: writing '" + path + "' failed");
    return ok_status();
  }
  // Files of up to 2^31 values come from one generator, tensor after tensor, as they always
  // have (the test models and benchmark files keep their bytes). Larger ones (Muse Glimmer 30B's
  // shapes) come in blocks of rows, each from a generator of its own seeded by (seed, tensor,
  // block), on every core: the same file whatever the number of threads, written at the disk's
  // speed (docs/gpu.md: 5.7 GB in 15-21 s on 16 cores).
  const bool parallel = n_params > (uint64_t(1) << 31);
  const unsigned n_threads = parallel ? std::max(1u, std::thread::hardware_concurrency()) : 1;
  std::mt19937_64 stream(seed);
  uint64_t written = 0;
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i < plan.size(); ++i) {
    const TensorPlan &t = plan[i];
    const uint64_t at = head.size() + gguf_get_tensor_offset(keys, int64_t(i));
    for (long pos = std::ftell(fp); uint64_t(pos) < at; ++pos) std::fputc(0, fp);
    const int64_t rows = t.ne[1] * t.ne[2] * t.ne[3];
    const size_t row_bytes = ggml_row_size(t.type, t.ne[0]);
    bytes.resize(row_bytes * size_t(rows));
    // One block (the whole tensor) from the shared stream, or blocks of ~2^18 values.
    const int64_t block =
        parallel ? std::max<int64_t>(1, (int64_t(1) << 18) / t.ne[0]) : std::max<int64_t>(1, rows);
    const int64_t n_blocks = (rows + block - 1) / block;
    std::atomic<int64_t> next{0};
    auto work = [&] {
      std::vector<float> values;
      for (int64_t b; (b = next.fetch_add(1)) < n_blocks;) {
        const int64_t row0 = b * block, n_rows = std::min(block, rows - row0);
        std::mt19937_64 own;
        if (parallel) {
          std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(i), uint32_t(b),
                            uint32_t(uint64_t(b) >> 32)};
          own.seed(seq);
        }
        std::mt19937_64 &rng = parallel ? own : stream;
        std::normal_distribution<float> normal(0.0f, 1.0f);
        values.resize(size_t(t.ne[0] * n_rows));
        if (!t.values.empty()) {
          std::copy(t.values.begin() + row0 * t.ne[0], t.values.begin() + (row0 + n_rows) * t.ne[0],
                    values.begin());
        } else
          for (float &v : values) {
            switch (t.init) {
            case TensorPlan::Normal:
              v = t.scale * normal(rng);
              break;
            case TensorPlan::Gain:
              v = 1.0f + t.scale * normal(rng);
              break;
            case TensorPlan::Constant:
              v = t.scale;
              break;
            }
          }
        ggml_quantize_chunk(t.type, values.data(), bytes.data() + size_t(row0) * row_bytes, 0,
                            n_rows, t.ne[0], nullptr);
      }
    };
    const unsigned n_workers = unsigned(std::min<int64_t>(n_threads, n_blocks));
    std::vector<std::thread> workers;
    for (unsigned w = 1; w < n_workers; ++w) workers.emplace_back(work);
    work();
    for (std::thread &w : workers) w.join();
    if (std::fwrite(bytes.data(), 1, bytes.size(), fp) != bytes.size())
      return Status::error("synth: write failed");
    written += bytes.size();
    if (progress) progress(written, total);
  }
  for (long pos = std::ftell(fp); pos % long(GGUF_DEFAULT_ALIGNMENT) != 0; ++pos) std::fputc(0, fp);
  // A full disk shows here (padding and buffered data): an error, not a short file.
  const bool failed = std::ferror(fp) != 0;
  if (std::fclose(closer.release()) != 0 || failed) {
    std::remove(path.c_str());
    return Status::error("synth: writing '" + path + "' failed");
  }
  return ok_status();
}

} // namespace offgraph::synth
