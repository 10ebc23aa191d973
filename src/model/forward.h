// Forward: computes one batch's logits on the CPU backend. Declares the batch's spans to a
// kv::Step, builds the model's graph, allocates it, fills the inputs, computes, copies out the
// wanted logits rows, and commits the step. A failure leaves every sequence as it was.
#pragma once

#include "kv/kv_store.h"
#include "model/model.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"

#include <vector>

namespace offgraph::model {

class Forward {
public:
  Forward(const Model &model, kv::KvStore &store, int n_threads);

  // Logits of batch.logit_rows, row after row (n_rows x n_vocab).
  Result<std::vector<float>> run(const Batch &batch);

private:
  const Model &model_;
  kv::KvStore &store_;
  ggml_backend_ptr backend_;
  ggml_gallocr_ptr alloc_;
};

// The cache layout a model needs: its geometry with this runtime policy.
Result<std::shared_ptr<const cache::Layout>> make_layout(const Model &model, cache::Policy policy);

} // namespace offgraph::model
