#include "device_flags.h"

#include <cstdio>
#include <sstream>

namespace offgraph::cli {

void add_device_flags(CLI::App &cmd, DeviceFlags &f) {
  cmd.add_option("--rpc", f.rpc,
                 "ggml-rpc-server endpoints HOST:PORT[,...]: the model's layers are split over "
                 "them (docs/backends.md); only 127.0.0.0/8 unless --rpc-allow-remote");
  cmd.add_option("--tensor-split", f.split,
                 "proportions of the layers per --rpc endpoint, comma-separated, with one more "
                 "for the local CPU if it is to hold layers (default: equal parts over the "
                 "endpoints); the output head counts as one more layer");
  cmd.add_flag("--rpc-allow-remote", f.allow_remote,
               "accept --rpc endpoints on other machines: ggml-rpc has no authentication or "
               "encryption, so anyone who reaches a server's port can read and write its memory; "
               "use it only on a network you trust");
}

namespace {

Result<model::DeviceOptions> device_options(const DeviceFlags &f) {
  model::DeviceOptions o;
  o.allow_remote = f.allow_remote;
  std::stringstream rpc(f.rpc);
  for (std::string ep; std::getline(rpc, ep, ',');)
    if (!ep.empty()) o.rpc.push_back(ep);
  std::stringstream split(f.split);
  for (std::string x; std::getline(split, x, ',');) {
    size_t used = 0;
    float v = 0;
    try {
      v = std::stof(x, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != x.size())
      return Status::error("--tensor-split: '" + x + "' is not a number");
    o.split.push_back(v);
  }
  if (!f.split.empty() && o.rpc.empty())
    return Status::error("--tensor-split needs --rpc (there is only the CPU to split over)");
  return o;
}

} // namespace

Result<std::unique_ptr<model::Model>> load_placed(const std::string &path, const DeviceFlags &f,
                                                  const model::Progress &progress) {
  auto options = device_options(f);
  if (!options.ok()) return options.status();
  if (options->rpc.empty()) return model::Model::load(path, progress);
  auto devices = model::Devices::open(*options);
  if (!devices.ok()) return Status::error("--rpc: " + devices.message());
  int last_percent = -1;
  std::string last_device;
  return model::Model::load(
      path, progress, *devices, [&](const std::string &device, uint64_t done, uint64_t total) {
        const int percent = total ? int(100 * done / total) : 100;
        if (device == last_device && percent / 10 == last_percent / 10 && done != total) return;
        last_device = device, last_percent = percent;
        std::fprintf(stderr, "offgraph: uploading weights to %s: %d%% of %.1f MiB\n",
                     device.c_str(), percent, double(total) / (1 << 20));
      });
}

void report_placement(const model::Model &model) {
  const model::Devices &d = model.devices();
  if (d.size() == 1) return;
  const auto bytes = model.device_weight_bytes();
  const int32_t n_layer = model.config().n_layer;
  for (int32_t dev = 0; dev < d.size(); ++dev) {
    int32_t first = -1, last = -1, count = 0;
    for (int32_t il = 0; il < n_layer; ++il)
      if (model.layer_device(il) == dev) {
        first = first < 0 ? il : first, last = il, ++count;
      }
    std::string layers =
        count == 0 ? "no layers" : "layers " + std::to_string(first) + "-" + std::to_string(last);
    if (model.output_device() == dev) layers += " and the output head";
    if (d.is_cpu(dev))
      std::fprintf(stderr, "offgraph: CPU: %s (weights mapped from the file)\n", layers.c_str());
    else
      std::fprintf(stderr, "offgraph: %s: %s, %.1f MiB of weights\n", d.name(dev).c_str(),
                   layers.c_str(), double(bytes[size_t(dev)]) / (1 << 20));
  }
}

} // namespace offgraph::cli
