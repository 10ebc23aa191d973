#include "model/forward.h"

#include "ggml-cpu.h"

#include <chrono>

namespace offgraph::model {

Forward::Forward(const Model &model, kv::KvStore &store, int n_threads)
    : model_(model), store_(store), backend_(ggml_backend_cpu_init()) {
  ggml_backend_cpu_set_n_threads(backend_.get(), n_threads);
  devices_ = model.shared_devices();
  const Devices &d = *devices_;
  if (d.size() == 1) {
    alloc_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
    return;
  }
  for (int32_t i = 0; i < d.size(); ++i)
    if (!d.is_cpu(i)) device_backends_.emplace_back(ggml_backend_dev_init(d.device(i), nullptr));
}

bool Forward::allocate(ggml_cgraph *gf, size_t n_nodes) {
  if (alloc_) return ggml_gallocr_alloc_graph(alloc_.get(), gf);
  if (!sched_ || sched_nodes_ < n_nodes) {
    std::vector<ggml_backend_t> backends;
    for (const auto &b : device_backends_) backends.push_back(b.get());
    backends.push_back(backend_.get()); // the scheduler wants the CPU last
    // Its hash set holds leafs too (every weight and cache tensor the graph reads), not only
    // nodes: room for both.
    const size_t size = 2 * n_nodes + size_t(model_.file().n_tensors());
    sched_.reset(
        ggml_backend_sched_new(backends.data(), nullptr, int(backends.size()), size, false, false));
    sched_nodes_ = n_nodes;
  }
  ggml_backend_sched_reset(sched_.get());
  // Custom ops carry C function pointers in their parameters: pinned to the CPU (a remote
  // backend would call this process's addresses in another).
  for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
    ggml_tensor *node = ggml_graph_node(gf, i);
    switch (node->op) {
    case GGML_OP_CUSTOM:
    case GGML_OP_MAP_CUSTOM1:
    case GGML_OP_MAP_CUSTOM2:
    case GGML_OP_MAP_CUSTOM3:
      ggml_backend_sched_set_tensor_backend(sched_.get(), node, backend_.get());
      break;
    default:
      break;
    }
  }
  return ggml_backend_sched_alloc_graph(sched_.get(), gf);
}

Result<std::vector<float>> Forward::run(const Batch &batch,
                                        std::vector<std::vector<float>> *hidden) {
  const ModelConfig &c = model_.config();
  const int64_t n = int64_t(batch.tokens.size());
  if (n == 0) return Status::error("forward: empty batch");
  int64_t covered = 0;
  for (const Batch::Span &s : batch.spans) covered += s.n_tokens;
  if (covered != n)
    return Status::error("forward: spans cover " + std::to_string(covered) + " of " +
                         std::to_string(n) + " tokens");
  for (int32_t t : batch.tokens)
    if (t < 0 || t >= c.n_vocab)
      return Status::error("forward: token id " + std::to_string(t) +
                           " is outside the vocabulary (0.." + std::to_string(c.n_vocab - 1) + ")");
  for (size_t i = 0; i < batch.logit_rows.size(); ++i)
    if (batch.logit_rows[i] < 0 || batch.logit_rows[i] >= n ||
        (i && batch.logit_rows[i] <= batch.logit_rows[i - 1]))
      return Status::error("forward: logit rows must be ascending indices into the batch");
  if (batch.logit_rows.empty()) return Status::error("forward: no logits requested");
  if (observer_ && !alloc_)
    return Status::error("forward: node profiling computes on the CPU alone, not with devices");
  if (std::string gone = model_.devices().failure(); !gone.empty())
    return Status::error("forward: a device of this model is gone: " + gone,
                         StatusCode::kUnavailable);
  for (size_t i = 0; i < batch.hidden_layers.size(); ++i)
    if (batch.hidden_layers[i] < 0 || batch.hidden_layers[i] >= c.n_layer ||
        (i && batch.hidden_layers[i] <= batch.hidden_layers[i - 1]))
      return Status::error("forward: hidden layers must ascend within [0, " +
                           std::to_string(c.n_layer) + ")");
  if (!batch.hidden_layers.empty() && !hidden)
    return Status::error("forward: hidden layers asked for, nowhere to put them");

  kv::Step step(store_);
  for (const Batch::Span &s : batch.spans) {
    auto span = step.add_span({s.seq, s.position, s.n_tokens});
    if (!span.ok()) return span.status();
  }
  // Tensor objects (views included) the graph may create: about 40 per layer for the
  // projections and MLP, up to 2 more per projection with a bias and a scale (16) and 7 for a
  // fused q/k/v split, and per attention span up to ~20 (query view, storage views for both
  // ring orders, set_rows indices, mask view, attention, reshapes). Counted generously: running
  // out aborts inside ggml, and metadata costs ~0.4 KB per object.
  const size_t n_nodes = size_t(64 + c.n_layer * (72 + 24 * batch.spans.size()));
  ggml_init_params params = {
      n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false), nullptr, true};
  ggml_context_ptr ctx(ggml_init(params));
  ggml_cgraph *gf = ggml_new_graph_custom(ctx.get(), n_nodes, false);
  GraphInputs in;
  in.tokens = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, n);
  in.positions = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, n);
  in.logit_rows = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, int64_t(batch.logit_rows.size()));
  for (ggml_tensor *t : {in.tokens, in.positions, in.logit_rows}) ggml_set_input(t);
  std::vector<ggml_tensor *> hidden_tensors;
  auto logits = build_forward(model_, ctx.get(), batch, in, step, &hidden_tensors);
  if (!logits.ok()) return logits.status();
  ggml_set_output(*logits);
  ggml_build_forward_expand(gf, *logits);
  for (ggml_tensor *h : hidden_tensors) { // outputs: the allocator may not reuse their memory
    ggml_set_output(h);
    ggml_build_forward_expand(gf, h);
  }
  if (!allocate(gf, n_nodes))
    return Status::error("forward: could not allocate the graph", StatusCode::kInternal);

  std::vector<int32_t> positions;
  for (const Batch::Span &s : batch.spans)
    for (int32_t i = 0; i < s.n_tokens; ++i) positions.push_back(s.position + i);
  ggml_backend_tensor_set(in.tokens, batch.tokens.data(), 0, ggml_nbytes(in.tokens));
  ggml_backend_tensor_set(in.positions, positions.data(), 0, ggml_nbytes(in.positions));
  if (in.logit_rows->buffer) // not in the graph when every row's logits are wanted
    ggml_backend_tensor_set(in.logit_rows, batch.logit_rows.data(), 0, ggml_nbytes(in.logit_rows));
  step.set_inputs();
  if (compute(gf) != GGML_STATUS_SUCCESS) return Status::error("forward: graph compute failed");
  // A server that stopped mid-step: the relay answered for it, so nothing read below is a result.
  auto device_lost = [&]() -> Status {
    std::string gone = model_.devices().failure();
    if (gone.empty()) return ok_status();
    return Status::error("forward: a device stopped during the step: " + gone,
                         StatusCode::kUnavailable);
  };
  OFFGRAPH_TRY(device_lost());
  std::vector<float> out(size_t(ggml_nelements(*logits)));
  ggml_backend_tensor_get(*logits, out.data(), 0, ggml_nbytes(*logits));
  if (hidden) {
    hidden->resize(hidden_tensors.size());
    for (size_t i = 0; i < hidden_tensors.size(); ++i) {
      (*hidden)[i].resize(size_t(ggml_nelements(hidden_tensors[i])));
      ggml_backend_tensor_get(hidden_tensors[i], (*hidden)[i].data(), 0,
                              ggml_nbytes(hidden_tensors[i]));
    }
  }
  OFFGRAPH_TRY(device_lost()); // the reads above went through it too
  if (Status s = step.commit(); !s.ok()) return s;
  return out;
}

ggml_status Forward::compute(ggml_cgraph *gf) {
  if (sched_) return ggml_backend_sched_graph_compute(sched_.get(), gf);
  if (!observer_) return ggml_backend_graph_compute(backend_.get(), gf);
  ggml_init_params params = {ggml_graph_overhead_custom(1, false), nullptr, true};
  ggml_context_ptr ctx(ggml_init(params));
  ggml_cgraph *one = ggml_new_graph_custom(ctx.get(), 1, false);
  for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
    ggml_graph_clear(one);
    ggml_graph_add_node(one, ggml_graph_node(gf, i));
    const auto start = std::chrono::steady_clock::now();
    if (ggml_status s = ggml_backend_graph_compute(backend_.get(), one); s != GGML_STATUS_SUCCESS)
      return s;
    observer_(ggml_graph_node(gf, i),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return GGML_STATUS_SUCCESS;
}

Result<std::shared_ptr<const cache::Layout>> make_layout(const Model &model, cache::Policy policy) {
  return cache::Layout::make(model.geometry(), policy);
}

} // namespace offgraph::model
