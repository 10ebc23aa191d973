#include "device_flags.h"

#include "model/amx_matmul.h"
#include "model/cpu_matmul.h"
#include "model/weight_memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

namespace offgraph::cli {

void add_device_flags(CLI::App &cmd, DeviceFlags &f) {
  // An empty value would read as the default: refused instead.
  const auto not_empty = [](const std::string &v) {
    return v.empty() ? std::string("an empty value; give one (see --help)") : std::string();
  };
  cmd.add_option("--gpu-layers,--n-gpu-layers", f.gpu_layers,
                 "how many of the layers (the output head counts as one more) run on the GPUs "
                 "and --rpc servers, taken from the end as llama.cpp does: a count or 'all' "
                 "(default: all; the rest run on the CPU)")
      ->check(not_empty);
  cmd.add_option("--device", f.device,
                 "the local GPUs to use, comma-separated (names as --list-devices shows them, "
                 "e.g. CUDA0), or 'none' for the CPU alone (default: every GPU found)")
      ->check(not_empty);
  cmd.add_flag_callback(
      "--list-devices",
      [] {
        std::fputs(model::Devices::describe_available().c_str(), stdout);
        std::fflush(stdout);
        std::exit(0);
      },
      "print the GPUs this build and machine offer (or why there are none) and the CPU, then "
      "exit");
  cmd.add_option("--rpc", f.rpc,
                 "ggml-rpc-server endpoints HOST:PORT[,...]: the model's layers are split over "
                 "them (docs/backends.md); only 127.0.0.0/8 unless --rpc-allow-remote");
  cmd.add_option("--tensor-split", f.split,
                 "proportions of the offloaded layers per GPU and --rpc endpoint, "
                 "comma-separated, or (without -ngl) with one more for the local CPU if it is to "
                 "hold layers (default: equal parts); the output head counts as one more layer");
  cmd.add_flag("--rpc-allow-remote", f.allow_remote,
               "accept --rpc endpoints on other machines: ggml-rpc has no authentication or "
               "encryption, so anyone who reaches a server's port can read and write its memory; "
               "use it only on a network you trust");
  cmd.add_flag("--no-amx", f.no_amx,
               "CPU matrix multiplies through ggml instead of AMX tiles (used by default for q8_0 "
               "weights and batches of 4+ rows where the CPU has AMX: docs/cpu-kernels.md)");
  cmd.add_flag("--mmap", f.mmap,
               "keep the weights in the file's mapping (the page cache, shared by processes "
               "serving one file) instead of reading them into anonymous memory in 2 MiB pages, "
               "the default where q8_0 holds at least half of the file, the kernel offers huge "
               "pages, every layer is on the CPU and they take at most half of the available "
               "memory (q8_0 decode a fifth to a third faster: docs/cpu-kernels.md)");
  cmd.add_flag("--no-row-dot", f.no_row_dot,
               "q8_0 multiplies of 1-3 rows (decode) through ggml's dot product instead of "
               "offgraph's AVX-512 VNNI row-dot kernel (the same bits for one-token steps, slower: "
               "docs/cpu-kernels.md)");
}

void expand_device_flag_aliases(int argc, char **argv) {
  // CLI11 takes one-letter short names only; llama.cpp's users type -ngl N, -ngl=N, -dev X and
  // -dev=X.
  static char gpu_layers[] = "--gpu-layers", device[] = "--device";
  static std::vector<std::string> rewritten; // the -x=V forms, alive as long as argv is used
  rewritten.reserve(size_t(argc));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") return;
    if (a == "-ngl")
      argv[i] = gpu_layers;
    else if (a == "-dev")
      argv[i] = device;
    else if (a.rfind("-ngl=", 0) == 0)
      argv[i] = rewritten.emplace_back("--gpu-layers" + a.substr(4)).data();
    else if (a.rfind("-dev=", 0) == 0)
      argv[i] = rewritten.emplace_back("--device" + a.substr(4)).data();
  }
}

namespace {

Result<model::DeviceOptions> device_options(const DeviceFlags &f) {
  model::DeviceOptions o;
  o.allow_remote = f.allow_remote;
  if (!f.device.empty()) {
    o.gpus.emplace();
    if (f.device != "none") {
      std::stringstream names(f.device);
      for (std::string name; std::getline(names, name, ',');) {
        if (name.empty() || name == "none")
          return Status::error("--device: '" + f.device +
                               "' is not a list of GPU names (or 'none' alone)");
        o.gpus->push_back(name);
      }
    }
  }
  if (f.gpu_layers == "all") o.n_gpu_layers = std::numeric_limits<int32_t>::max();
  if (!f.gpu_layers.empty() && f.gpu_layers != "all") {
    size_t used = 0;
    long v = -1;
    try {
      v = std::stol(f.gpu_layers, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != f.gpu_layers.size() || v < 0 || v > 1000000)
      return Status::error("-ngl: '" + f.gpu_layers + "' is not a layer count or 'all'");
    o.n_gpu_layers = int32_t(v);
  }
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
  return o;
}

} // namespace

Result<std::unique_ptr<model::Model>> load_placed(const std::string &path, const DeviceFlags &f,
                                                  const model::Progress &progress) {
  auto options = device_options(f);
  if (!options.ok()) return options.status();
  model::set_amx_enabled(!f.no_amx);
  model::set_row_dot_enabled(!f.no_row_dot);
  model::set_weight_storage(f.mmap ? model::WeightStorage::mapped
                                   : model::WeightStorage::automatic);
  auto devices = model::Devices::open(*options);
  if (!devices.ok()) return devices.status();
  if ((*devices)->size() == 1) {
    // Nothing to offload to: said when the flags asked for a GPU, so that it is not a surprise.
    if ((!f.gpu_layers.empty() && f.gpu_layers != "0") || !f.split.empty())
      std::fprintf(stderr, "offgraph: no GPU (%s): every layer runs on the CPU\n",
                   f.device == "none" ? "--device none" : model::Devices::why_no_gpu().c_str());
  }
  int last_percent = -1;
  std::string last_device;
  auto loaded = model::Model::load(
      path, progress, (*devices)->size() == 1 ? nullptr : *devices,
      [&](const std::string &device, uint64_t done, uint64_t total) {
        const int percent = total ? int(100 * done / total) : 100;
        if (device == last_device && percent / 10 == last_percent / 10 && done != total) return;
        last_device = device, last_percent = percent;
        std::fprintf(stderr, "offgraph: uploading weights to %s: %d%% of %.1f MiB\n",
                     device.c_str(), percent, double(total) / (1 << 20));
      });
  if (loaded.ok())
    std::fprintf(stderr, "offgraph: weights in %s\n", (*loaded)->weight_storage().c_str());
  return loaded;
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
