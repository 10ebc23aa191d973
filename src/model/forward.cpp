#include "model/forward.h"

#include "base/units.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>

namespace offgraph::model {
namespace {

bool is_custom(const ggml_tensor *t) {
  switch (t->op) {
  case GGML_OP_CUSTOM:
  case GGML_OP_MAP_CUSTOM1:
  case GGML_OP_MAP_CUSTOM2:
  case GGML_OP_MAP_CUSTOM3:
    return true;
  default:
    return false;
  }
}

// Every tensor of a graph: its nodes in order, then the tensors they read that are not nodes
// (inputs, weights, storage), in the order the nodes first name them. (ggml keeps the leafs'
// list private; this order is as deterministic.)
std::vector<ggml_tensor *> graph_tensors(ggml_cgraph *gf) {
  const int n_nodes = ggml_graph_n_nodes(gf);
  std::vector<ggml_tensor *> all;
  std::unordered_map<const ggml_tensor *, size_t> place;
  for (int i = 0; i < n_nodes; ++i) {
    all.push_back(ggml_graph_node(gf, i));
    place.emplace(all.back(), all.size());
  }
  auto visit = [&](ggml_tensor *t) {
    if (t && place.emplace(t, all.size() + 1).second) all.push_back(t);
  };
  for (int i = 0; i < n_nodes; ++i) {
    const ggml_tensor *node = ggml_graph_node(gf, i);
    for (int s = 0; s < GGML_MAX_SRC; ++s) visit(node->src[s]);
    visit(node->view_src);
  }
  // A read tensor may itself be a view of one no node names.
  for (size_t i = size_t(n_nodes); i < all.size(); ++i) visit(all[i]->view_src);
  return all;
}

// What the scheduler's splits and allocation, and a server's stored copy of its split, depend
// on, tensor by tensor (graph_tensors): op, type, shape, strides, flags, parameters, view
// offset, sources and view source (as places in the list), and the address of whatever was
// allocated before the graph (weights, KV storage and views of them). A custom op's parameters
// are left out: they point at this step's kernel parameters (rows read, pages), which the reused
// graph takes over (adopt_allocation). Two graphs with equal signatures are the same
// computation on different input values.
std::vector<uint64_t> graph_signature(ggml_cgraph *gf, const std::vector<ggml_tensor *> &all) {
  std::unordered_map<const ggml_tensor *, uint64_t> place;
  place.reserve(all.size());
  for (size_t i = 0; i < all.size(); ++i) place.emplace(all[i], uint64_t(i) + 1);
  auto where = [&](const ggml_tensor *t) -> uint64_t { return t ? place.at(t) : 0; };
  std::vector<uint64_t> sig;
  sig.reserve(all.size() * 40);
  sig.push_back(uint64_t(ggml_graph_n_nodes(gf)));
  sig.push_back(uint64_t(all.size()));
  auto add = [&](const ggml_tensor *t) {
    sig.push_back(uint64_t(t->op));
    sig.push_back(uint64_t(t->type));
    sig.push_back(uint64_t(t->flags));
    for (int d = 0; d < GGML_MAX_DIMS; ++d) sig.push_back(uint64_t(t->ne[d]));
    for (int d = 0; d < GGML_MAX_DIMS; ++d) sig.push_back(uint64_t(t->nb[d]));
    if (!is_custom(t))
      for (size_t p = 0; p < GGML_MAX_OP_PARAMS / sizeof(int32_t); ++p)
        sig.push_back(uint64_t(uint32_t(t->op_params[p])));
    sig.push_back(uint64_t(t->view_offs));
    sig.push_back(where(t->view_src));
    for (int s = 0; s < GGML_MAX_SRC; ++s) sig.push_back(where(t->src[s]));
    sig.push_back(uint64_t(reinterpret_cast<uintptr_t>(t->data)));
    sig.push_back(uint64_t(reinterpret_cast<uintptr_t>(t->buffer)));
  };
  for (const ggml_tensor *t : all) add(t);
  return sig;
}

// `fresh` (unallocated, the same signature as `allocated`) takes over allocated's memory, tensor
// by tensor, so that inputs written to it and outputs read from it are allocated's; allocated's
// custom ops take over fresh's parameters (this step's kernel parameters).
void adopt_allocation(const std::vector<ggml_tensor *> &fresh,
                      const std::vector<ggml_tensor *> &allocated) {
  for (size_t i = 0; i < fresh.size(); ++i) {
    ggml_tensor *f = fresh[i], *a = allocated[i];
    f->buffer = a->buffer;
    f->data = a->data;
    f->extra = a->extra;
    if (is_custom(a)) std::memcpy(a->op_params, f->op_params, sizeof(a->op_params));
  }
}

// ggml-rpc answers no graph compute: a step's logits read is what waits for a device's part of
// the step to end, and what finds a server that died during it. A step without logits reads a
// few bytes of its last write on each device (one per buffer type) instead.
void wait_for_devices(const std::vector<ggml_tensor *> &writes) {
  std::vector<ggml_backend_buffer_type_t> read;
  uint8_t probe[4];
  for (auto w = writes.rbegin(); w != writes.rend(); ++w) {
    ggml_backend_buffer_t buffer = (*w)->view_src ? (*w)->view_src->buffer : (*w)->buffer;
    if (!buffer || ggml_backend_buffer_is_host(buffer)) continue;
    ggml_backend_buffer_type_t type = ggml_backend_buffer_get_type(buffer);
    if (std::find(read.begin(), read.end(), type) != read.end()) continue;
    read.push_back(type);
    ggml_backend_tensor_get(*w, probe, 0, std::min(sizeof probe, ggml_nbytes(*w)));
  }
}

// What ggml's allocator compares to tell whether a graph fits the plan it holds: each node's
// size and each of its sources' (0 for a view or a tensor whose memory is not the allocator's),
// after the node count.
// (Into `sizes`, reused step after step: this runs every step under a compute limit.)
void allocation_sizes(ggml_cgraph *gf, std::vector<size_t> &sizes) {
  auto size = [](const ggml_tensor *t) -> size_t {
    return !t || t->data || t->view_src ? 0 : ggml_nbytes(t);
  };
  const int n = ggml_graph_n_nodes(gf);
  sizes.clear();
  sizes.push_back(size_t(n));
  for (int i = 0; i < n; ++i) {
    const ggml_tensor *node = ggml_graph_node(gf, i);
    sizes.push_back(size(node));
    for (int j = 0; j < GGML_MAX_SRC; ++j) sizes.push_back(size(node->src[j]));
  }
}

// A graph of `sizes` within the plan made for `plan` (allocation_sizes of both): the same node
// count and nothing larger.
bool fits_plan(const std::vector<size_t> &sizes, const std::vector<size_t> &plan) {
  if (plan.empty() || sizes.size() != plan.size() || sizes[0] != plan[0]) return false;
  for (size_t i = 1; i < sizes.size(); ++i)
    if (sizes[i] > plan[i]) return false;
  return true;
}

} // namespace

Forward::Forward(const Model &model, kv::KvStore &store, int n_threads)
    : model_(model), store_(store), backend_(ggml_backend_cpu_init()), n_threads_(n_threads) {
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

kv::BytesByBufferType Forward::compute_buffer_bytes() const {
  kv::BytesByBufferType by;
  if (alloc_) {
    kv::add_bytes(by, ggml_backend_get_default_buffer_type(backend_.get()),
                  int64_t(ggml_gallocr_get_buffer_size(alloc_.get(), 0) + work_size_));
  } else if (sched_) {
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched_.get()); ++i) {
      ggml_backend_t b = ggml_backend_sched_get_backend(sched_.get(), i);
      kv::add_bytes(by, ggml_backend_get_default_buffer_type(b),
                    int64_t(ggml_backend_sched_get_buffer_size(sched_.get(), b)));
    }
  }
  return by;
}

int64_t Forward::buffer_frees() const {
  return kv::device_buffer_frees() + model_.devices().buffer_frees();
}

std::vector<ggml_backend_t> Forward::scheduler_backends() const {
  std::vector<ggml_backend_t> backends;
  for (const auto &b : device_backends_) backends.push_back(b.get());
  backends.push_back(backend_.get()); // the scheduler wants the CPU last
  return backends;
}

size_t Forward::scheduler_size(size_t n_nodes) const {
  // Its hash set holds leafs too (every weight and cache tensor the graph reads), not only
  // nodes: room for both.
  return 2 * n_nodes + size_t(model_.file().n_tensors());
}

void Forward::pin_custom_ops(ggml_backend_sched_t sched, ggml_cgraph *gf) const {
  // Custom ops carry C function pointers in their parameters: pinned to the CPU (a remote
  // backend would call this process's addresses in another).
  for (int i = 0; i < ggml_graph_n_nodes(gf); ++i)
    if (ggml_tensor *node = ggml_graph_node(gf, i); is_custom(node))
      ggml_backend_sched_set_tensor_backend(sched, node, backend_.get());
}

ggml_gallocr_t Forward::measurer() {
  if (!measurer_)
    measurer_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
  return measurer_.get();
}

std::string Forward::over_compute_limit(const kv::BytesByBufferType &needs,
                                        const kv::BytesByBufferType &held) {
  if (!compute_limit_) return {};
  for (const auto &[buft, bytes] : needs) {
    const int64_t limit = compute_limit_(buft);
    if (limit >= 0 && bytes > limit && bytes > kv::bytes_on(held, buft))
      return ++compute_refusals_, "its compute buffer on " +
                                      std::string(ggml_backend_buft_name(buft)) +
                                      " would grow to " + mib(bytes) + ", past the " + mib(limit) +
                                      " the compute budget leaves it";
  }
  return {};
}

bool Forward::allocate(ggml_cgraph *gf, size_t n_nodes, ggml_context_ptr &ctx,
                       std::string &refused) {
  if (alloc_) return allocate_alone(gf, refused);
  std::vector<ggml_tensor *> tensors = graph_tensors(gf);
  std::vector<uint64_t> signature = graph_signature(gf, tensors);
  // A server forgets its stored graphs whenever any buffer of it is freed (a sequence removed, a
  // snapshot dropped): then the graph is sent again. The stores count their frees as they make
  // them (exact, this thread); the relays count every FREE_BUFFER request, from anywhere, once
  // they read it. A freed buffer's memory may also come back at the same address for other
  // storage, which the signature could not tell apart.
  const int64_t frees = buffer_frees();
  if (last_.graph && signature == last_.signature && frees == last_.buffer_frees) {
    adopt_allocation(tensors, last_.tensors);
    ++graphs_reused_;
    return true;
  }
  // The scheduler still points into the last graph: it goes once the new one is allocated.
  LastGraph replaced = std::move(last_);
  last_ = {};
  if (!sched_ || sched_nodes_ < n_nodes) {
    std::vector<ggml_backend_t> backends = scheduler_backends();
    sched_.reset(ggml_backend_sched_new(backends.data(), nullptr, int(backends.size()),
                                        scheduler_size(n_nodes), false, false));
    sched_nodes_ = n_nodes;
  }
  ggml_backend_sched_reset(sched_.get());
  pin_custom_ops(sched_.get(), gf);
  const kv::BytesByBufferType held = compute_buffer_bytes();
  if (!ggml_backend_sched_alloc_graph(sched_.get(), gf)) {
    sched_.reset(); // its allocator kept the plan its buffers could not hold (allocate_alone)
    return false;
  }
  // The scheduler cannot be asked beforehand without splitting the graph a second time (it
  // rewrites what it splits): a graph whose buffers grew past the compute budget is refused
  // right after, and the scheduler, with its buffers, goes.
  if (refused = over_compute_limit(compute_buffer_bytes(), held); !refused.empty()) {
    sched_.reset();
    return false;
  }
  ++graphs_built_;
  // Counted after allocation: the scheduler may have freed its own compute buffers to grow them.
  last_ = {std::move(ctx), gf, std::move(tensors), std::move(signature), buffer_frees()};
  return true;
}

bool Forward::allocate_alone(ggml_cgraph *gf, std::string &refused) {
  const kv::BytesByBufferType held = compute_buffer_bytes();
  plan_ = ggml_graph_plan(gf, n_threads_, nullptr);
  if (compute_limit_) {
    // ggml's allocator grows its buffer only for a graph some node (or source) of which is
    // larger than the plan it holds, or whose node count differs: such a graph is measured
    // first, by an allocator that never allocates, and refused where it needs more than the
    // budget leaves (with the work buffer it needs). Decode steps repeat their shapes and skip
    // the measure (45 us a step on the 0.4b file).
    allocation_sizes(gf, sizes_);
    size_t graph_bytes = ggml_gallocr_get_buffer_size(alloc_.get(), 0);
    const bool measure = !fits_plan(sizes_, planned_);
    if (measure) {
      size_t bytes = 0;
      ggml_gallocr_reserve_n_size(measurer(), gf, nullptr, nullptr, &bytes);
      graph_bytes = std::max(graph_bytes, bytes);
    }
    kv::BytesByBufferType needs;
    kv::add_bytes(needs, ggml_backend_get_default_buffer_type(backend_.get()),
                  int64_t(graph_bytes + std::max(work_size_, plan_.work_size)));
    if (refused = over_compute_limit(needs, held); !refused.empty()) return false;
    if (measure) planned_.swap(sizes_);
  }
  if (plan_.work_size > work_size_ && !observer_) { // (node profiling computes on the backend)
    work_.reset(new (std::nothrow) uint8_t[plan_.work_size]);
    work_size_ = work_ ? plan_.work_size : 0;
    if (!work_) return false;
  }
  if (!ggml_gallocr_alloc_graph(alloc_.get(), gf)) {
    // ggml keeps the new plan even though its buffer could not be had: a later graph of the same
    // shape would be placed in no buffer. A fresh allocator instead.
    alloc_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
    planned_.clear();
    return false;
  }
  // A plan made again from scratch (ggml re-plans when the leaf count differs, which the sizes
  // above do not see) that came out larger: the allocator and its buffer go.
  if (refused = over_compute_limit(compute_buffer_bytes(), held); !refused.empty()) {
    alloc_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
    planned_.clear();
    return false;
  }
  return true;
}

Status Forward::check(const Batch &batch, bool wants_hidden) const {
  const ModelConfig &c = model_.config();
  const int64_t n = int64_t(batch.tokens.size());
  if (n == 0) return Status::error("forward: empty batch");
  int64_t covered = 0;
  for (const Batch::Span &s : batch.spans) covered += s.n_tokens;
  if (covered != n)
    return Status::error("forward: spans cover " + std::to_string(covered) + " of " +
                         std::to_string(n) + " tokens");
  for (size_t i = 0; i < batch.embedding_at.size(); ++i)
    if (batch.embedding_at[i] < 0 || batch.embedding_at[i] >= n ||
        (i && batch.embedding_at[i] <= batch.embedding_at[i - 1]))
      return Status::error("forward: embedding rows must be ascending indices into the batch");
  if (batch.embeddings.size() != batch.embedding_at.size() * size_t(c.n_embd))
    return Status::error("forward: " + std::to_string(batch.embeddings.size()) +
                         " embedding values for " + std::to_string(batch.embedding_at.size()) +
                         " rows of width " + std::to_string(c.n_embd));
  // Where the input is an embedding row, the token id only names the row (for prefix reuse);
  // embedding_at ascends (checked above).
  auto embedded = batch.embedding_at.begin();
  for (size_t i = 0; i < batch.tokens.size(); ++i) {
    if (embedded != batch.embedding_at.end() && size_t(*embedded) == i) {
      ++embedded;
      continue;
    }
    if (const int32_t t = batch.tokens[i]; t < 0 || t >= c.n_vocab)
      return Status::error("forward: token id " + std::to_string(t) +
                           " is outside the vocabulary (0.." + std::to_string(c.n_vocab - 1) + ")");
  }
  for (size_t i = 0; i < batch.logit_rows.size(); ++i)
    if (batch.logit_rows[i] < 0 || batch.logit_rows[i] >= n ||
        (i && batch.logit_rows[i] <= batch.logit_rows[i - 1]))
      return Status::error("forward: logit rows must be ascending indices into the batch");
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
  if (!batch.hidden_layers.empty() && !wants_hidden)
    return Status::error("forward: hidden layers asked for, nowhere to put them");
  return ok_status();
}

Result<Forward::Graph> Forward::build(const Batch &batch, kv::Step &step) {
  const ModelConfig &c = model_.config();
  const int64_t n = int64_t(batch.tokens.size());
  for (size_t i = 0; i < batch.spans.size(); ++i) {
    const Batch::Span &s = batch.spans[i];
    auto span = step.add_span({s.seq, s.position, s.n_tokens});
    if (!span.ok()) {
      // Storage that could not be had (kv::Step marks it): the batch may run without the span.
      if (span.status().code() == StatusCode::kResourceExhausted) failed_span_ = int32_t(i);
      return span.status();
    }
  }
  // Tensor objects (views included) the graph may create: about 40 per layer for the
  // projections and MLP, up to 2 more per projection with a bias and a scale (16) and 7 for a
  // fused q/k/v split, 1 more per projection on AMX tiles (the packed activations, up to 10 with
  // Gemma 4's per-layer input), and per attention span up to ~20 (query view, storage views for
  // both ring orders, set_rows indices, mask view, attention, reshapes), ~16 more where a ring
  // step writes after it reads (staging, joins, the writes' views). Counted generously: running
  // out aborts inside ggml, and metadata costs ~0.4 KB per object.
  Graph g;
  g.n_nodes = size_t(64 + c.n_layer * (82 + 40 * batch.spans.size()));
  ggml_init_params params = {g.n_nodes * ggml_tensor_overhead() +
                                 ggml_graph_overhead_custom(g.n_nodes, false),
                             nullptr, true};
  g.ctx.reset(ggml_init(params));
  g.gf = ggml_new_graph_custom(g.ctx.get(), g.n_nodes, false);
  step.set_graph(g.gf);
  // With no logit rows the builder still gets one (never uploaded: the head is left out below).
  GraphInputs &in = g.in;
  in.tokens = ggml_new_tensor_1d(g.ctx.get(), GGML_TYPE_I32, n);
  in.positions = ggml_new_tensor_1d(g.ctx.get(), GGML_TYPE_I32, n);
  in.logit_rows = ggml_new_tensor_1d(g.ctx.get(), GGML_TYPE_I32,
                                     std::max<int64_t>(1, int64_t(batch.logit_rows.size())));
  for (ggml_tensor *t : {in.tokens, in.positions, in.logit_rows}) ggml_set_input(t);
  if (!batch.embedding_at.empty()) {
    const int64_t m = int64_t(batch.embedding_at.size());
    in.embedding_at = ggml_new_tensor_1d(g.ctx.get(), GGML_TYPE_I64, m);
    in.embeddings = ggml_new_tensor_2d(g.ctx.get(), GGML_TYPE_F32, c.n_embd, m);
    ggml_set_input(in.embedding_at);
    ggml_set_input(in.embeddings);
  }
  auto logits = build_forward(model_, g.ctx.get(), batch, in, step, &g.hidden);
  if (!logits.ok()) return logits.status();
  if (!batch.logit_rows.empty()) {
    g.logits = *logits;
    ggml_set_output(g.logits);
    ggml_build_forward_expand(g.gf, g.logits);
  } else {
    // A pass that wants no logits (a prompt chunk before the last) computes what the cache keeps
    // and what orders it: every layer up to the K/V writes of the last one holding a cache (and
    // its ring's joined copy where a deferred write must follow it), not its attention, its MLP,
    // the layers after it that share a donor's cache, or the head (which cost a prefill chunk of
    // a small model as much as its layers).
    for (ggml_tensor *w : step.writes()) ggml_build_forward_expand(g.gf, w);
  }
  for (ggml_tensor *h : g.hidden) { // outputs: the allocator may not reuse their memory
    ggml_set_output(h);
    ggml_build_forward_expand(g.gf, h);
  }
  return g;
}

Result<kv::BytesByBufferType> Forward::measure(const Batch &batch) try {
  failed_span_ = -1;
  OFFGRAPH_TRY(check(batch, true));
  kv::Step step(store_);
  auto g = build(batch, step);
  if (!g.ok()) return g.status();
  kv::BytesByBufferType by;
  if (alloc_) {
    size_t bytes = 0;
    ggml_gallocr_reserve_n_size(measurer(), g->gf, nullptr, nullptr, &bytes);
    const size_t work = ggml_graph_plan(g->gf, n_threads_, nullptr).work_size;
    kv::add_bytes(by, ggml_backend_get_default_buffer_type(backend_.get()), int64_t(bytes + work));
    return by;
  }
  // ggml's scheduler rewrites the graph it splits (inputs copied between devices): a scheduler
  // of its own, made for this graph and dropped with it.
  std::vector<ggml_backend_t> backends = scheduler_backends();
  // (ggml_backend_sched_reserve_size resets the scheduler first, so custom ops cannot be pinned
  // to the CPU here as run() pins them; they read host storage, which keeps them there.)
  ggml_backend_sched_ptr sched(ggml_backend_sched_new(
      backends.data(), nullptr, int(backends.size()), scheduler_size(g->n_nodes), false, false));
  std::vector<size_t> sizes(backends.size(), 0);
  ggml_backend_sched_reserve_size(sched.get(), g->gf, sizes.data());
  for (size_t i = 0; i < backends.size(); ++i) { // backends sharing a buffer type share a buffer
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(backends[i]);
    auto it = std::find_if(by.begin(), by.end(), [buft](const auto &b) { return b.first == buft; });
    if (it == by.end())
      by.push_back({buft, int64_t(sizes[i])});
    else
      it->second = std::max(it->second, int64_t(sizes[i]));
  }
  return by;
} catch (const std::bad_alloc &) {
  return Status::error("forward: out of host memory measuring the graph of " +
                           std::to_string(batch.tokens.size()) + " tokens",
                       StatusCode::kInternal);
}

Result<std::vector<float>> Forward::run(const Batch &batch,
                                        std::vector<std::vector<float>> *hidden) try {
  failed_span_ = -1;
  allocation_failed_ = false;
  compute_began_ = false;
  OFFGRAPH_TRY(check(batch, hidden != nullptr));
  // Token ids are looked up where the input is not an embedding row; elsewhere they only name
  // the row (for prefix reuse) and id 0 is looked up (then replaced).
  // (A copy only for batches with embedding rows: decode steps upload the tokens as they are.)
  std::vector<int32_t> replaced;
  if (!batch.embedding_at.empty()) {
    replaced = batch.tokens;
    for (int32_t at : batch.embedding_at) replaced[size_t(at)] = 0;
  }
  const std::vector<int32_t> &lookup = batch.embedding_at.empty() ? batch.tokens : replaced;

  using clock = std::chrono::steady_clock;
  auto mark = clock::now();
  auto lap = [&](double &into) {
    const auto now = clock::now();
    into += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  kv::Step step(store_);
  auto built = build(batch, step);
  if (!built.ok()) return built.status();
  Graph &g = *built;
  const GraphInputs &in = g.in;
  lap(phases_.build);
  std::string refused;
  if ((allocation_fault_ && allocation_fault_(batch)) ||
      !allocate(g.gf, g.n_nodes, g.ctx, refused)) {
    allocation_failed_ = true;
    return Status::error("forward: could not allocate the graph of " +
                             std::to_string(batch.tokens.size()) + " tokens" +
                             (refused.empty() ? "" : ": " + refused),
                         StatusCode::kInternal);
  }
  // The graph computed: the last one when reused (this step's tensors hold its memory).
  ggml_cgraph *computed = last_.graph ? last_.graph : g.gf;
  lap(phases_.allocate);

  std::vector<int32_t> positions;
  for (const Batch::Span &s : batch.spans)
    for (int32_t i = 0; i < s.n_tokens; ++i) positions.push_back(s.position + i);
  ggml_backend_tensor_set(in.tokens, lookup.data(), 0, ggml_nbytes(in.tokens));
  if (in.embeddings) {
    const std::vector<int64_t> at(batch.embedding_at.begin(), batch.embedding_at.end());
    ggml_backend_tensor_set(in.embedding_at, at.data(), 0, ggml_nbytes(in.embedding_at));
    ggml_backend_tensor_set(in.embeddings, batch.embeddings.data(), 0, ggml_nbytes(in.embeddings));
  }
  ggml_backend_tensor_set(in.positions, positions.data(), 0, ggml_nbytes(in.positions));
  if (in.logit_rows->buffer) // not in the graph when every row's logits are wanted
    ggml_backend_tensor_set(in.logit_rows, batch.logit_rows.data(), 0, ggml_nbytes(in.logit_rows));
  step.set_inputs();
  lap(phases_.inputs);
  compute_began_ = true;
  if (compute(computed) != GGML_STATUS_SUCCESS) {
    last_ = {};
    return Status::error("forward: graph compute failed");
  }
  // Every FREE_BUFFER sent before the compute reached its relay before the compute's answer came
  // back through it (one connection, in order): counted now, none is mistaken for a later one.
  if (last_.graph) last_.buffer_frees = buffer_frees();
  // A server that stopped mid-step: the relay answered for it, so nothing read below is a result.
  auto device_lost = [&]() -> Status {
    std::string gone = model_.devices().failure();
    if (gone.empty()) return ok_status();
    return Status::error("forward: a device stopped during the step: " + gone,
                         StatusCode::kUnavailable);
  };
  OFFGRAPH_TRY(device_lost());
  lap(phases_.compute);
  std::vector<float> out(g.logits ? size_t(ggml_nelements(g.logits)) : 0);
  if (g.logits)
    ggml_backend_tensor_get(g.logits, out.data(), 0, ggml_nbytes(g.logits));
  else if (sched_)
    wait_for_devices(step.writes());
  if (hidden) {
    hidden->resize(g.hidden.size());
    for (size_t i = 0; i < g.hidden.size(); ++i) {
      (*hidden)[i].resize(size_t(ggml_nelements(g.hidden[i])));
      ggml_backend_tensor_get(g.hidden[i], (*hidden)[i].data(), 0, ggml_nbytes(g.hidden[i]));
    }
  }
  OFFGRAPH_TRY(device_lost()); // the reads above went through it too (logits or probes)
  if (Status s = step.commit(); !s.ok()) return s;
  lap(phases_.outputs);
  ++phases_.steps;
  return out;
} catch (const std::bad_alloc &) {
  // Host memory the pass could not have (its inputs, the graph's bookkeeping, the logits'
  // copy), before the step's commit: nothing of it is kept, and the next pass builds its graph
  // afresh. Before the compute it is a graph that cannot be allocated (a smaller batch may run);
  // after it, the rings were written: a failed pass.
  last_ = {};
  allocation_failed_ = !compute_began_;
  const std::string tokens = std::to_string(batch.tokens.size()) + " tokens";
  return Status::error(allocation_failed_
                           ? "forward: could not allocate the graph of " + tokens +
                                 " (out of host memory)"
                           : "forward: out of host memory reading the results of " + tokens,
                       StatusCode::kInternal);
}

ggml_status Forward::compute(ggml_cgraph *gf) {
  if (sched_) return ggml_backend_sched_graph_compute(sched_.get(), gf);
  if (!observer_) { // gf's plan and work buffer, made when it was allocated
    plan_.work_data = work_.get();
    return ggml_graph_compute(gf, &plan_);
  }
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
