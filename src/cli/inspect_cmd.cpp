#include "commands.h"

#include "cache/layout.h"
#include "kv/storage_types.h"
#include "model/model.h"

#include <cstdio>
#include <map>
#include <memory>

namespace offgraph::cli {

namespace {
std::string human(double bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", bytes, units[u]);
  return buf;
}
} // namespace

std::function<int()> add_inspect(CLI::App &app) {
  struct Opts {
    std::string path, ctk = "f16", ctv = "f16";
    int32_t ctx = 0, max_write = 512;
  };
  auto o = std::make_shared<Opts>();
  CLI::App *cmd =
      app.add_subcommand("inspect", "describe a GGUF model and the KV memory offgraph will hold");
  cmd->add_option("file", o->path, "the GGUF file")->required();
  cmd->add_option("--ctx", o->ctx, "context length for the KV figures (default: the model's)");
  cmd->add_option("--max-write", o->max_write, "largest step (prefill chunk)")
      ->capture_default_str();
  cmd->add_option("--ctk", o->ctk, "K cache type")->capture_default_str();
  cmd->add_option("--ctv", o->ctv, "V cache type")->capture_default_str();
  return [o]() -> int {
    auto m = model::Model::open_metadata(o->path);
    if (!m.ok()) return std::fprintf(stderr, "offgraph inspect: %s\n", m.message().c_str()), 1;
    const model::ModelConfig &c = (*m)->config();
    const model::GgufFile &f = (*m)->file();
    std::printf("file:          %s (%s)\n", o->path.c_str(), human(double(f.file_size())).c_str());
    std::printf("architecture:  %s%s\n", c.arch_name.c_str(),
                c.name.empty() ? "" : (" (" + c.name + ")").c_str());
    std::printf("parameters:    %lld (%.2fB)\n", (long long)(*m)->n_params(),
                double((*m)->n_params()) / 1e9);
    std::printf("shape:         %s\n", c.describe().c_str());
    std::printf("weights:       %s\n",
                f.has_weights()
                    ? "present"
                    : ("none: this is a metadata-only file (" + f.weights_missing() + ")").c_str());
    std::map<std::string, int> types;
    for (ggml_tensor *t = ggml_get_first_tensor(f.tensors()); t;
         t = ggml_get_next_tensor(f.tensors(), t))
      ++types[ggml_type_name(t->type)];
    std::printf("weight types: ");
    for (const auto &[name, n] : types) std::printf(" %s x %d", name.c_str(), n);
    std::printf("\n");

    auto ctk = kv::parse_storage_type(o->ctk), ctv = kv::parse_storage_type(o->ctv);
    if (!ctk.ok() || !ctv.ok())
      return std::fprintf(stderr, "offgraph inspect: %s\n",
                          (ctk.ok() ? ctv : ctk).message().c_str()),
             1;
    const int32_t ctx = o->ctx > 0 ? o->ctx : c.n_ctx_train;
    auto layout = cache::Layout::make((*m)->geometry(), {ctx, std::min(o->max_write, ctx), 512});
    if (!layout.ok())
      return std::fprintf(stderr, "offgraph inspect: %s\n", layout.message().c_str()), 1;
    const kv::StorageTypes st{*ctk, *ctv};
    int n_flat = 0, n_ring = 0;
    double held = 0, full = 0, per_token_flat = 0, per_token_ring = 0;
    std::printf("layers:\n");
    for (cache::CacheId id = 0; id < (*layout)->n_caches(); ++id) {
      const cache::CacheLayout &cl = (*layout)->cache(id);
      const double row =
          double(kv::k_row_bytes(**layout, id, st) + kv::v_row_bytes(**layout, id, st));
      std::printf("  %2d  %-22s %s\n", id, cl.spec.attention.describe().c_str(),
                  cl.ring() ? ("ring of " + std::to_string(cl.max_rows) + " rows").c_str()
                            : "flat");
      (cl.ring() ? n_ring : n_flat)++;
      (cl.ring() ? per_token_ring : per_token_flat) += row;
      held += row * double(cl.ring() ? cl.max_rows : ctx);
      full += row * double(ctx);
    }
    std::printf("caches:        %d flat, %d ring (K %s, V %s, max_write %d)\n", n_flat, n_ring,
                o->ctk.c_str(), o->ctv.c_str(), (*layout)->max_write());
    std::printf("KV per token:  %s on flat layers, %s on ring layers (until the rings fill)\n",
                human(per_token_flat).c_str(), human(per_token_ring).c_str());
    std::printf("KV at %d tokens: offgraph %s (%.3f GB), full cache on every layer %s (%.3f GB), "
                "%.2fx less\n",
                ctx, human(held).c_str(), held / 1e9, human(full).c_str(), full / 1e9, full / held);
    return 0;
  };
}

} // namespace offgraph::cli
