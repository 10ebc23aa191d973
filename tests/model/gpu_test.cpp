// Layers on local GPUs (ggml's CUDA backend, the CUDA build: docs/gpu.md). Where this machine has
// no GPU every test here skips and says why; cli.devices_without_a_gpu and cli.serve_devices check
// that a build with the CUDA backend starts and runs on the CPU then. Where it has one: the same
// steps on the CPU alone and with every layer (or the last few, -ngl) on the GPU give the same
// logits and the same greedy tokens, with the rings wrapping, across forks, rewinds and snapshots,
// and each layer's weights and KV storage live on its layer's device.
#include "device_compare.h"

#include <gtest/gtest.h>

namespace offgraph::model {
namespace {

using testing::compare;
using testing::make_model;
using testing::Session;

// Every layer on the first GPU (n_gpu_layers -1), or the last `n_gpu_layers` slots.
std::shared_ptr<const Devices> open_gpu(int32_t n_gpu_layers = -1) {
  const auto gpus = Devices::local_gpus();
  if (gpus.empty()) return nullptr;
  DeviceOptions o;
  o.gpus = std::vector<std::string>{ggml_backend_dev_name(gpus[0])};
  o.n_gpu_layers = n_gpu_layers;
  auto d = Devices::open(o);
  EXPECT_TRUE(d.ok()) << d.message();
  return d.ok() ? *d : nullptr;
}

#define SKIP_WITHOUT_GPU()                                                                         \
  do {                                                                                             \
    if (Devices::local_gpus().empty()) {                                                           \
      GTEST_SKIP() << "no GPU: " << Devices::why_no_gpu();                                         \
    }                                                                                              \
  } while (0)

// f32 weights and KV, one token a step: the GPU's f32 products (ggml-cuda's vector kernel for
// single rows) and attention (f32 products and softmax for f32 storage, step.cpp) against the
// CPU's: the same greedy token on every row, logits within 1e-4 relative. With spans of 2-16
// tokens ggml-cuda multiplies f32 weights on TF32 tensor cores (mmf): 1.7e-3 relative on the
// H200 (2026-12-04) and flipped near-ties of these random models; the chunked tests below
// bound that case.
TEST(Gpu, EveryLayerOnTheGpuGivesTheCpuLogits) {
  SKIP_WITHOUT_GPU();
  for (const std::string arch : {"muse-glimmer", "llama"}) {
    SCOPED_TRACE(arch);
    const std::string path = make_model(arch, 7);
    Session cpu(path, nullptr);
    Session gpu(path, open_gpu());
    int64_t reused = 0;
    compare(cpu, gpu, 11, reused, "gpu f32", 1e-4, /*one_token_steps=*/true);
    if (HasFatalFailure()) return;
  }
}

// f16 KV on both (the GPU's flash attention runs): the same greedy tokens, logits within 1e-2.
TEST(Gpu, F16KvOnTheGpuGivesTheCpuLogits) {
  SKIP_WITHOUT_GPU();
  const std::string path = make_model("muse-glimmer", 9);
  Session cpu(path, nullptr, GGML_TYPE_F16);
  Session gpu(path, open_gpu(), GGML_TYPE_F16);
  int64_t reused = 0;
  compare(cpu, gpu, 12, reused, "gpu f16", 1e-2);
}

// -ngl 3 of 7 slots: layers 0-3 on the CPU (offgraph's kernels), 4-5 and the head on the GPU.
TEST(Gpu, PartialOffloadTakesLayersFromTheEnd) {
  SKIP_WITHOUT_GPU();
  const std::string path = make_model("muse-glimmer", 8);
  Session cpu(path, nullptr);
  Session part(path, open_gpu(3));
  ASSERT_TRUE(part.model);
  const Devices &d = part.model->devices();
  ASSERT_EQ(d.size(), 2);
  for (int32_t il = 0; il < 6; ++il)
    EXPECT_EQ(part.model->layer_device(il), il < 4 ? d.cpu() : 0) << il;
  EXPECT_EQ(part.model->output_device(), 0);
  const Weights &w = part.model->weights();
  EXPECT_EQ(ggml_backend_buffer_get_type(w.layers[5].wq.w->buffer), d.buffer_type(0));
  EXPECT_TRUE(ggml_backend_buffer_is_host(w.layers[0].wq.w->buffer));
  EXPECT_TRUE(ggml_backend_buffer_is_host(w.tok_embd->buffer));
  EXPECT_FALSE(ggml_backend_buffer_is_host(w.output.w->buffer));
  int64_t reused = 0;
  compare(cpu, part, 13, reused, "gpu -ngl", 1e-3);
  if (HasFatalFailure()) return;
  const kv::SeqId seq = *part.store->create_sequence();
  part.step(seq, {1, 2, 3});
  for (int32_t il = 0; il < 6; ++il) {
    ggml_tensor *k = part.store->k_storage(seq, part.model->geometry().cache_of_layer(il));
    EXPECT_EQ(ggml_backend_buffer_is_host(k->buffer), il < 4) << il;
  }
}

// Naming a GPU that is not there is an error that says which there are (or why none).
TEST(Gpu, AnUnknownDeviceIsNamedInTheError) {
  DeviceOptions o;
  o.gpus = std::vector<std::string>{"CUDA99"};
  auto d = Devices::open(o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.message().find("CUDA99"), std::string::npos) << d.message();
  if (Devices::local_gpus().empty()) {
    EXPECT_NE(d.message().find(Devices::why_no_gpu()), std::string::npos) << d.message();
  }
}

// -ngl without any GPU or server places nothing elsewhere; with the CPU's share given as a
// proportion too, it is refused (both would place the CPU's layers).
TEST(Gpu, NglAndACpuProportionContradict) {
  DeviceOptions o;
  o.gpus.emplace();
  o.n_gpu_layers = 4;
  auto d = Devices::open(o);
  ASSERT_TRUE(d.ok()) << d.message();
  EXPECT_EQ((*d)->size(), 1);
  o.rpc = {"127.0.0.1:1"};
  o.split = {1, 1};
  auto both = Devices::open(o);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.message().find("-ngl"), std::string::npos) << both.message();
}

} // namespace
} // namespace offgraph::model
