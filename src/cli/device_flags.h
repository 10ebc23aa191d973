// Where layers run: --rpc, --tensor-split and --rpc-allow-remote, on every command that loads a
// model for inference (docs/backends.md), and the load that honours them.
#pragma once

#include "model/model.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

namespace offgraph::cli {

struct DeviceFlags {
  std::string rpc, split;
  bool allow_remote = false;
};

void add_device_flags(CLI::App &cmd, DeviceFlags &flags);
// Connects to the devices the flags name (an error naming the flag at fault) and loads the model
// onto them, reporting each device's upload on stderr; `progress` as Model::load.
Result<std::unique_ptr<model::Model>> load_placed(const std::string &path, const DeviceFlags &flags,
                                                  const model::Progress &progress = nullptr);
// One line per device: its layers and weight bytes (stderr, after loading).
void report_placement(const model::Model &model);

} // namespace offgraph::cli
