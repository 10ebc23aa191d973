// Where layers run: -ngl, --device, --list-devices, --rpc, --tensor-split, --rpc-allow-remote
// and --no-amx,
// on every command that loads a model for inference (docs/gpu.md, docs/backends.md), and the
// load that honours them.
#pragma once

#include "model/model.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

namespace offgraph::cli {

struct DeviceFlags {
  std::string rpc, split;
  std::string gpu_layers; // "" (all), a count, or "all"
  std::string device;     // "" (every GPU found), "none", or names "CUDA0,CUDA1"
  bool allow_remote = false;
  bool no_amx = false; // ggml's CPU matrix multiplies instead of AMX tiles (model/amx_matmul.h)
  bool mmap = false;   // weights in the file's mapping, not anonymous huge pages (weight_memory.h)
  bool no_row_dot = false; // ggml's dot product for decode instead of model/cpu_matmul.h's
};

void add_device_flags(CLI::App &cmd, DeviceFlags &flags);
// llama.cpp's spellings -ngl and -dev (CLI11 takes one-letter short names only), rewritten to
// --gpu-layers and --device in argv before parsing.
void expand_device_flag_aliases(int argc, char **argv);
// Connects to the devices the flags name (an error naming the flag at fault) and loads the model
// onto them, reporting each device's upload on stderr; `progress` as Model::load.
Result<std::unique_ptr<model::Model>> load_placed(const std::string &path, const DeviceFlags &flags,
                                                  const model::Progress &progress = nullptr);
// One line per device: its layers and weight bytes (stderr, after loading).
void report_placement(const model::Model &model);

} // namespace offgraph::cli
