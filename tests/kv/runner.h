// Runs one Step's attention calls through a real ggml graph, the way a model would: inputs as
// graph tensors, gallocr allocation, set_inputs, compute. Outputs are poisoned with NaN before
// compute so that rows attention failed to write are caught. The backend is the CPU's unless one
// is given (a device whose memory is not the host's, where the store's storage lives too).
#pragma once

#include "kv/step.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace offgraph::kv::testing {

struct Call {
  int32_t span = 0;
  cache::CacheId cache = 0;
  int32_t n_q_heads = 1;
  float scale = 1.0f;
  std::vector<float> q, k, v; // [T][H][D] each
  std::vector<float> out;     // filled by run()
  std::string kernel;         // the name of the op that attended (offgraph's kernels name theirs)
  bool computed = true;       // the attention is in the graph (a writes-only step leaves them out)
};

class Runner {
public:
  Runner() : backend_(ggml_backend_cpu_init()) {
    ggml_backend_cpu_set_n_threads(backend_.get(), 2);
  }
  explicit Runner(ggml_backend_ptr backend) : backend_(std::move(backend)) {}

  // Returns false (with a test failure) if the step could not be built or computed.
  // `writes_only`: the graph is built as a prefill chunk wanting no logits builds it (the
  // step's writes are its only outputs); no call's output is read then, and each call's
  // `computed` says whether its attention went into the graph anyway.
  bool run(Step &step, const cache::Layout &layout, std::vector<Call> &calls,
           bool writes_only = false) {
    const size_t n_nodes = 64 + 48 * calls.size();
    ggml_init_params params = {n_nodes * ggml_tensor_overhead() +
                                   ggml_graph_overhead_custom(n_nodes, false),
                               nullptr, true};
    ggml_context_ptr ctx(ggml_init(params));
    ggml_cgraph *gf = ggml_new_graph_custom(ctx.get(), n_nodes, false);
    step.set_graph(gf);
    // q, k and v live in a buffer of their own, so the graph allocator cannot place an output
    // over them (poisoning that output would then poison the input).
    ggml_init_params in_params = {3 * calls.size() * ggml_tensor_overhead(), nullptr, true};
    ggml_context_ptr in_ctx(ggml_init(in_params));
    std::vector<std::tuple<ggml_tensor *, ggml_tensor *, ggml_tensor *, ggml_tensor *>> io;
    for (Call &c : calls) {
      const cache::CacheSpec &s = layout.cache(c.cache).spec;
      const int64_t T = step.spans()[size_t(c.span)].n_tokens;
      ggml_tensor *q =
          ggml_new_tensor_3d(in_ctx.get(), GGML_TYPE_F32, s.k_head_dim, c.n_q_heads, T);
      ggml_tensor *k =
          ggml_new_tensor_3d(in_ctx.get(), GGML_TYPE_F32, s.k_head_dim, s.n_kv_heads, T);
      ggml_tensor *v =
          ggml_new_tensor_3d(in_ctx.get(), GGML_TYPE_F32, s.v_head_dim, s.n_kv_heads, T);
      auto out = step.update_and_attend(ctx.get(), q, k, v, c.span, c.cache, c.scale);
      if (!out.ok()) {
        ADD_FAILURE() << out.message();
        return false;
      }
      if (!writes_only) {
        ggml_set_output(*out);
        ggml_build_forward_expand(gf, *out);
      }
      c.kernel = (*out)->op == GGML_OP_FLASH_ATTN_EXT ? "flash_attn_ext" : (*out)->name;
      io.emplace_back(q, k, v, *out);
    }
    if (writes_only) {
      for (ggml_tensor *w : step.writes()) ggml_build_forward_expand(gf, w);
      for (size_t i = 0; i < calls.size(); ++i)
        calls[i].computed = in_graph(gf, std::get<3>(io[i]));
    }
    ggml_backend_buffer_ptr in_buf(ggml_backend_alloc_ctx_tensors(in_ctx.get(), backend_.get()));
    ggml_gallocr_ptr alloc(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
    if (!ggml_gallocr_alloc_graph(alloc.get(), gf)) {
      ADD_FAILURE() << "graph allocation failed";
      return false;
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      auto [q, k, v, out] = io[i];
      ggml_backend_tensor_set(q, calls[i].q.data(), 0, ggml_nbytes(q));
      ggml_backend_tensor_set(k, calls[i].k.data(), 0, ggml_nbytes(k));
      ggml_backend_tensor_set(v, calls[i].v.data(), 0, ggml_nbytes(v));
      if (writes_only) continue;
      std::vector<float> poison(size_t(ggml_nelements(out)),
                                std::numeric_limits<float>::quiet_NaN());
      ggml_backend_tensor_set(out, poison.data(), 0, ggml_nbytes(out));
    }
    step.set_inputs(); // after the poison: an output may reuse an index tensor's memory
    if (ggml_backend_graph_compute(backend_.get(), gf) != GGML_STATUS_SUCCESS) {
      ADD_FAILURE() << "graph compute failed";
      return false;
    }
    for (size_t i = 0; i < calls.size() && !writes_only; ++i) {
      ggml_tensor *out = std::get<3>(io[i]);
      EXPECT_TRUE(ggml_is_contiguous(out));
      calls[i].out.resize(size_t(ggml_nelements(out)));
      ggml_backend_tensor_get(out, calls[i].out.data(), 0, ggml_nbytes(out));
    }
    return true;
  }

private:
  static bool in_graph(ggml_cgraph *gf, const ggml_tensor *t) {
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i)
      if (ggml_graph_node(gf, i) == t) return true;
    return false;
  }
  ggml_backend_ptr backend_;
};

} // namespace offgraph::kv::testing
