// Forward: computes one batch's logits. Declares the batch's spans to a kv::Step, builds the
// model's graph, allocates it, fills the inputs, computes, copies out the wanted logits rows, and
// commits the step. A failure leaves every sequence as it was. On the CPU alone the CPU backend
// computes the graph; with layers on other devices (model::Devices) ggml's scheduler splits it,
// and every custom op (a function pointer: offgraph's attention and soft-cap kernels) is pinned
// to the CPU, so that none ever reaches another backend. There a step whose graph is the last
// step's again (same shapes, same storage: a decode step within a page) reuses the last graph's
// allocation and splits, so that ggml-rpc servers recompute their stored copy instead of
// receiving the graph again.
#pragma once

#include "kv/kv_store.h"
#include "model/model.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace offgraph::model {

class Forward {
public:
  Forward(const Model &model, kv::KvStore &store, int n_threads);

  // Logits of batch.logit_rows, row after row (n_rows x n_vocab); with none wanted the pass only
  // fills the cache. With batch.hidden_layers, `hidden` gets each named layer's input for every
  // token (n_tokens x n_embd, token after token).
  Result<std::vector<float>> run(const Batch &batch,
                                 std::vector<std::vector<float>> *hidden = nullptr);
  // After a run that failed because one span's storage could not be reserved (the pool, the
  // budget), that span's index in batch.spans: nothing was computed, the batch without it may
  // run; else (any other failure, or none) -1.
  int32_t failed_span() const { return failed_span_; }
  // After a run that failed because its graph could not be allocated (a device's memory, the
  // compute buffer for this many tokens, host memory the pass needed: run() catches
  // std::bad_alloc): nothing was kept, a smaller batch may run.
  bool allocation_failed() const { return allocation_failed_; }
  // Fault injection for tests: called with each batch before its graph is allocated; true fails
  // the allocation as if the memory could not be had.
  using AllocationFault = std::function<bool(const Batch &batch)>;
  void set_allocation_fault(AllocationFault fault) { allocation_fault_ = std::move(fault); }
  // The compute buffers the graphs are allocated in now, by buffer type (one per device): ggml's
  // allocator grows them to the largest step so far (the most tokens, the deepest history); the
  // scheduler's are made again when a step needs a larger graph. On the CPU alone the graphs'
  // work buffer counts too (with devices it is the CPU backend's own, not counted).
  kv::BytesByBufferType compute_buffer_bytes() const;
  // The compute budget: the most bytes this pass's compute buffer may grow to on a buffer type
  // (the budget less what another model's passes hold there), or a negative number for no
  // limit. A graph that would grow it past that is refused as one whose memory could not be had
  // (allocation_failed(), the message naming the budget): on the CPU alone before its buffer
  // grows, with devices right after ggml's scheduler grew it (the scheduler and its buffers are
  // then freed). A graph that fits the buffers already held runs whatever the limit.
  using ComputeLimit = std::function<int64_t(ggml_backend_buffer_type_t)>;
  void set_compute_limit(ComputeLimit limit) { compute_limit_ = std::move(limit); }
  int64_t compute_refusals() const { return compute_refusals_; } // graphs the limit refused
  // The compute buffers `batch`'s graph needs, by buffer type: the graph built and measured,
  // nothing allocated, computed or committed (the spans' storage is reserved as for a run).
  Result<kv::BytesByBufferType> measure(const Batch &batch);

  // Profiling (offgraph bench --profile-ops): with an observer set, the graph is computed one
  // node at a time and the observer gets each node with its wall time. Slower (one thread
  // handoff per node), for finding where a step's time goes, never for measuring speed. On the
  // CPU alone (refused with other devices).
  using NodeObserver = std::function<void(const ggml_tensor *node, double seconds)>;
  void set_node_observer(NodeObserver observer) { observer_ = std::move(observer); }

private:
  // Allocates the graph's tensors (on the devices the scheduler picks, custom ops on the CPU),
  // or, with the scheduler, hands them the last graph's allocation when `gf` is that graph
  // again; `ctx` (gf's) is then kept as the last graph's.
  // `refused` says why where the compute budget refused it.
  bool allocate(ggml_cgraph *gf, size_t n_nodes, ggml_context_ptr &ctx, std::string &refused);
  bool allocate_alone(ggml_cgraph *gf, std::string &refused); // the CPU alone (alloc_)
  // A step's graph and what the run reads and writes through it.
  struct Graph {
    ggml_context_ptr ctx;
    ggml_cgraph *gf = nullptr;
    size_t n_nodes = 0; // the graph's capacity
    GraphInputs in;
    ggml_tensor *logits = nullptr; // null: the batch wants none
    std::vector<ggml_tensor *> hidden;
  };
  Status check(const Batch &batch, bool wants_hidden) const;
  // Declares the batch's spans to `step` (failed_span_ where one's storage cannot be had) and
  // builds its graph.
  Result<Graph> build(const Batch &batch, kv::Step &step);
  std::vector<ggml_backend_t> scheduler_backends() const;
  size_t scheduler_size(size_t n_nodes) const;
  void pin_custom_ops(ggml_backend_sched_t sched, ggml_cgraph *gf) const;
  ggml_gallocr_t measurer(); // an allocator that only measures (the CPU alone)
  // Why `needs` grows a buffer past what it `held` and past the compute limit, or empty (a
  // refusal is counted).
  std::string over_compute_limit(const kv::BytesByBufferType &needs,
                                 const kv::BytesByBufferType &held);
  ggml_status compute(ggml_cgraph *gf);
  // Device buffers freed so far, as the stores and the relays count them (LastGraph).
  int64_t buffer_frees() const;

  const Model &model_;
  kv::KvStore &store_;
  ggml_backend_ptr backend_; // the CPU's
  ggml_gallocr_ptr alloc_;   // the CPU alone
  // The CPU alone: the graph's compute plan (made when it is allocated) and its work buffer (the
  // CPU backend's otherwise, private to it): ours, so that the compute budget counts it and a
  // work buffer that cannot be had is a graph that cannot be allocated, not a failed pass.
  int n_threads_;
  ggml_cplan plan_{};
  std::unique_ptr<uint8_t[]> work_;
  size_t work_size_ = 0;
  ggml_gallocr_ptr measurer_;
  ComputeLimit compute_limit_;
  int64_t compute_refusals_ = 0;
  // allocation_sizes() of the largest graph measured against the compute limit since alloc_'s
  // plan last grew: a graph within it cannot grow the buffer.
  std::vector<size_t> planned_, sizes_; // (sizes_: the current graph's, a scratch)
  // Other devices: their backends (split order), then the CPU's, and the scheduler over them.
  // The devices (their relays) outlive the backends and buffers that talk through them.
  std::shared_ptr<const Devices> devices_;
  std::vector<ggml_backend_ptr> device_backends_;
  ggml_backend_sched_ptr sched_;
  size_t sched_nodes_ = 0; // the graph size the scheduler was made for
  // The graph the scheduler holds allocated, with its context and signature (graph_signature):
  // a step whose graph has the same signature computes this one.
  struct LastGraph {
    ggml_context_ptr ctx;
    ggml_cgraph *graph = nullptr;
    std::vector<ggml_tensor *> tensors; // graph_tensors
    std::vector<uint64_t> signature;
    int64_t buffer_frees = 0; // Devices::buffer_frees when it was allocated or last computed
  } last_;
  int64_t graphs_reused_ = 0, graphs_built_ = 0;

public:
  // Steps that computed the last graph again, and steps that allocated a new one (with devices).
  int64_t graphs_reused() const { return graphs_reused_; }
  int64_t graphs_built() const { return graphs_built_; }

  // Wall seconds spent in each phase of run(), summed over the steps since the last reset: what a
  // step costs beside the compute (offgraph bench prints them per test: docs/gpu.md).
  struct PhaseTimes {
    double build = 0;    // declaring spans, building the graph
    double allocate = 0; // signature, reuse or the scheduler's allocation
    double inputs = 0;   // tokens, positions, indices and masks uploaded
    double compute = 0;  // the graph computed (every device, synchronised)
    double outputs = 0;  // logits (and hidden rows) read back, the step committed
    int64_t steps = 0;
  };
  const PhaseTimes &phase_times() const { return phases_; }
  void reset_phase_times() { phases_ = {}; }

private:
  NodeObserver observer_;
  AllocationFault allocation_fault_;
  int32_t failed_span_ = -1;
  bool allocation_failed_ = false;
  bool compute_began_ = false; // this run's graph began computing (its writes may have landed)
  PhaseTimes phases_;
};

// The cache layout a model needs: its geometry with this runtime policy.
Result<std::shared_ptr<const cache::Layout>> make_layout(const Model &model, cache::Policy policy);

} // namespace offgraph::model
