#include "model/model.h"

#include "model/arch.h"
#include "model/graph.h"

#include <algorithm>

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
  auto geo = cache::Geometry::build(layers, m->config_.n_kv_shared_layers);
  if (!geo.ok()) return geo.status();
  m->geometry_ = std::move(geo).value();
  m->layer_device_ = m->devices_->assign(m->config_.n_layer);
  return m;
}

Result<std::unique_ptr<Model>> Model::load(const std::string &path, const Progress &progress,
                                           std::shared_ptr<const Devices> devices,
                                           const DeviceProgress &device_progress) {
  auto m = open_metadata(path);
  if (!m.ok()) return m.status();
  Model &model = **m;
  if (devices) {
    model.devices_ = std::move(devices);
    model.layer_device_ = model.devices_->assign(model.config_.n_layer);
  }
  bool all_on_cpu = model.devices_->is_cpu(model.output_device());
  for (int32_t il = 0; il < model.config_.n_layer; ++il)
    all_on_cpu = all_on_cpu && model.devices_->is_cpu(model.layer_device(il));
  WeightBytes bytes{model.file_->file_size(), 0};
  for (ggml_tensor *t = ggml_get_first_tensor(model.file_->tensors()); t;
       t = ggml_get_next_tensor(model.file_->tensors(), t))
    if (t->type == GGML_TYPE_Q8_0) bytes.q8_0 += ggml_nbytes(t);
  const StorageChoice storage = choose_weight_storage(bytes, all_on_cpu);
  model.weight_storage_ = storage.why;
  Status mapped = model.file_->map_weights(progress, storage.anonymous);
  if (!mapped.ok() && storage.anonymous &&
      offgraph::model::weight_storage() == WeightStorage::automatic) {
    // (Memory the kernel will not commit, say: the mapping needs none.)
    model.weight_storage_ =
        "the file's mapping (anonymous memory failed: " + mapped.message() + ")";
    mapped = model.file_->map_weights(progress, false);
  }
  if (!mapped.ok()) return mapped;
  if (storage.anonymous && !model.file_->weights_huge_pages_advised())
    model.weight_storage_ += "; the kernel refused the advice for huge pages";
  if (!all_on_cpu)
    if (Status s = model.place(device_progress); !s.ok()) return s;
  return m;
}

Status Model::place(const DeviceProgress &progress) {
  const Devices &d = *devices_;
  for (int32_t dev = 0; dev < d.size(); ++dev) {
    if (d.is_cpu(dev)) continue;
    // The slots this device holds; a tensor two slots share (a tied head) is uploaded once.
    std::vector<ggml_tensor **> slots;
    for (int32_t il = 0; il < config_.n_layer; ++il)
      if (layer_device(il) == dev)
        for_each_slot(weights_.layers[size_t(il)], [&](ggml_tensor *&t) {
          if (t) slots.push_back(&t);
        });
    if (output_device() == dev)
      for_each_output_slot(weights_, [&](ggml_tensor *&t) {
        if (t) slots.push_back(&t);
      });
    if (slots.empty()) continue;
    ggml_init_params params = {slots.size() * ggml_tensor_overhead(), nullptr, true};
    ggml_context_ptr ctx(ggml_init(params));
    if (!ctx) return Status::error("placing weights: could not create a ggml context");
    std::vector<std::pair<ggml_tensor *, ggml_tensor *>> copies; // (mapped, on the device)
    for (ggml_tensor **slot : slots) {
      auto same = std::find_if(copies.begin(), copies.end(),
                               [&](const auto &c) { return c.first == *slot; });
      if (same != copies.end()) continue;
      ggml_tensor *t = ggml_dup_tensor(ctx.get(), *slot);
      ggml_set_name(t, ggml_get_name(*slot));
      copies.emplace_back(*slot, t);
    }
    ggml_backend_buffer_ptr buffer(
        ggml_backend_alloc_ctx_tensors_from_buft(ctx.get(), d.buffer_type(dev)));
    if (!buffer)
      return Status::error("placing weights: " + d.name(dev) + " could not allocate " +
                           std::to_string(ggml_backend_alloc_ctx_tensors_from_buft_size(
                               ctx.get(), d.buffer_type(dev))) +
                           " bytes for its layers' weights");
    // Weights: ggml-rpc then offers a server started with -c its cached copy by hash.
    ggml_backend_buffer_set_usage(buffer.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    uint64_t total = 0, done = 0;
    for (const auto &c : copies) total += ggml_nbytes(c.second);
    for (const auto &[mapped, placed] : copies) {
      ggml_backend_tensor_set(placed, mapped->data, 0, ggml_nbytes(placed));
      done += ggml_nbytes(placed);
      if (progress) progress(d.name(dev), done, total);
    }
    for (ggml_tensor **slot : slots)
      *slot = std::find_if(copies.begin(), copies.end(), [&](const auto &c) {
                return c.first == *slot;
              })->second;
    // The mapped tensors the CPU no longer reads: the token embedding stays read there (the
    // input lookup) when a tied head was uploaded.
    for (const auto &[mapped, placed] : copies)
      if (mapped != weights_.tok_embd) host_released_bytes_ += int64_t(ggml_nbytes(mapped));
    device_ctx_.push_back(std::move(ctx));
    device_buffers_.emplace_back(dev, std::move(buffer));
  }
  return ok_status();
}

std::vector<ggml_backend_buffer_type_t> Model::cache_buffer_types() const {
  std::vector<ggml_backend_buffer_type_t> out(size_t(geometry_.n_caches()), nullptr);
  for (int32_t il = 0; il < config_.n_layer; ++il) {
    auto &b = out[size_t(geometry_.cache_of_layer(il))];
    if (!geometry_.is_shared_layer(il)) b = devices_->buffer_type(layer_device(il));
  }
  return out;
}

std::vector<int64_t> Model::device_weight_bytes() const {
  std::vector<int64_t> out(size_t(devices_->size()), 0);
  for (const auto &[dev, buffer] : device_buffers_)
    out[size_t(dev)] += int64_t(ggml_backend_buffer_get_size(buffer.get()));
  out[size_t(devices_->cpu())] = weight_bytes() - host_released_bytes_;
  return out;
}

int64_t Model::weight_bytes() const {
  int64_t n = 0;
  for (ggml_tensor *t = ggml_get_first_tensor(file_->tensors()); t;
       t = ggml_get_next_tensor(file_->tensors(), t))
    n += int64_t(ggml_nbytes(t));
  return n;
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
