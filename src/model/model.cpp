#include "model/model.h"

#include "model/arch.h"
#include "model/graph.h"

namespace offgraph::model {

Result<std::unique_ptr<Model>> Model::open_metadata(const std::string &path) {
  auto file = GgufFile::open(path);
  if (!file.ok()) return file.status();
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file).value();
  auto config = read_config(*m->file_);
  if (!config.ok()) return config.status();
  m->config_ = *config;
  m->arch_ = find_architecture(m->config_.arch_name);
  if (m->config_.softcap > 0)
    m->softcap_ = {m->config_.logit_scale / m->config_.softcap, m->config_.softcap};
  TensorBinder binder(*m->file_);
  if (Status s = m->arch_->bind_weights(binder, m->config_, m->weights_); !s.ok()) return s;
  if (Status s = binder.finish(m->config_.arch_name); !s.ok()) return s;
  auto layers = m->config_.layer_specs();
  auto geo = cache::Geometry::build(layers, 0);
  if (!geo.ok()) return geo.status();
  m->geometry_ = std::move(geo).value();
  return m;
}

Result<std::unique_ptr<Model>> Model::load(const std::string &path, const Progress &progress) {
  auto m = open_metadata(path);
  if (!m.ok()) return m.status();
  if (Status s = (*m)->file_->map_weights(progress); !s.ok()) return s;
  return m;
}

int64_t Model::n_params() const {
  int64_t n = 0;
  for (ggml_tensor *t = ggml_get_first_tensor(file_->tensors()); t;
       t = ggml_get_next_tensor(file_->tensors(), t))
    n += ggml_nelements(t);
  return n;
}

Result<ggml_tensor *> build_forward(const Model &model, ggml_context *ctx, const Batch &batch,
                                    const GraphInputs &in, kv::Step &step,
                                    std::vector<ggml_tensor *> *hidden) {
  std::vector<ggml_tensor *> captured;
  auto logits =
      model.architecture().build_graph(GraphBuilder(model, ctx, batch, in, step, &captured));
  if (!logits.ok()) return logits;
  if (captured.size() != batch.hidden_layers.size())
    return Status::error("forward: the graph gave " + std::to_string(captured.size()) + " of the " +
                             std::to_string(batch.hidden_layers.size()) +
                             " hidden layers asked for",
                         StatusCode::kInternal);
  if (hidden) *hidden = std::move(captured);
  return logits;
}

} // namespace offgraph::model
