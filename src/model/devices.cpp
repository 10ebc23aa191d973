#include "model/devices.h"

#include "base/units.h"

#include "model/amx_matmul.h"
#include "model/cpu_matmul.h"

#include "ggml-cpu.h"
#include "ggml-rpc.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace offgraph::model {

namespace {

struct HostPort {
  std::string host;
  int port = 0;
};

Result<HostPort> split_endpoint(const std::string &endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size())
    return Status::error("RPC endpoint '" + endpoint + "': expected HOST:PORT");
  HostPort hp{endpoint.substr(0, colon), 0};
  const std::string port = endpoint.substr(colon + 1);
  if (port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) ||
      (hp.port = std::stoi(port)) < 1 || hp.port > 65535)
    return Status::error("RPC endpoint '" + endpoint + "': port '" + port +
                         "' is not a number in 1..65535");
  // ggml-rpc splits at the first colon: an IPv6 literal cannot be given.
  if (hp.host.find(':') != std::string::npos)
    return Status::error("RPC endpoint '" + endpoint +
                         "': IPv6 addresses are not supported by ggml-rpc; use a host name");
  return hp;
}

// Every address the host resolves to (IPv4; ggml-rpc connects over IPv4).
Result<std::vector<in_addr>> resolve(const HostPort &hp, const std::string &endpoint) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *found = nullptr;
  if (int e = getaddrinfo(hp.host.c_str(), nullptr, &hints, &found); e != 0 || !found)
    return Status::error("RPC endpoint '" + endpoint + "': cannot resolve '" + hp.host +
                         "': " + gai_strerror(e));
  std::vector<in_addr> out;
  for (addrinfo *a = found; a; a = a->ai_next)
    out.push_back(reinterpret_cast<sockaddr_in *>(a->ai_addr)->sin_addr);
  freeaddrinfo(found);
  return out;
}

// ggml-rpc aborts the process when it cannot connect: try first, so that a server that is not
// there is an error that names it.
Status probe(const in_addr &addr, int port, const std::string &endpoint) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status::error("RPC endpoint '" + endpoint + "': cannot create a socket");
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(port));
  sa.sin_addr = addr;
  const int r = connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa));
  close(fd);
  if (r != 0)
    return Status::error("RPC endpoint '" + endpoint +
                         "': no ggml-rpc-server answers there (start one with "
                         "`ggml-rpc-server -p PORT`)");
  return ok_status();
}

// The address offgraph will connect to for `endpoint` (the first it resolves to), after checking
// every address it resolves to against the loopback rule: resolved once, so that the address
// checked is the address used.
Result<sockaddr_in> checked_address(const std::string &endpoint, bool allow_remote) {
  auto hp = split_endpoint(endpoint);
  if (!hp.ok()) return hp.status();
  auto addrs = resolve(*hp, endpoint);
  if (!addrs.ok()) return addrs.status();
  if (!allow_remote)
    for (const in_addr &a : *addrs)
      if ((ntohl(a.s_addr) >> 24) != 127)
        return Status::error("RPC endpoint '" + endpoint + "' is not on this machine (" +
                             inet_ntoa(a) +
                             "): ggml-rpc has no authentication or encryption, so anyone who "
                             "reaches the port can read and write its memory; pass "
                             "--rpc-allow-remote on a network you trust (docs/backends.md)");
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(hp->port));
  sa.sin_addr = (*addrs)[0];
  return sa;
}

} // namespace

Status check_endpoint(const std::string &endpoint, bool allow_remote) {
  return checked_address(endpoint, allow_remote).status();
}

namespace {

// ggml builds its registry of backends on first use, and a backend that finds no device says
// why only in its log (ggml-cuda: "failed to initialize CUDA: <the runtime's reason>"). The
// first use goes through here, with ggml's log captured, so that the reason can be told.
const std::string &registry_log() {
  static const std::string log = [] {
    // Whoever set a logger before (a test silencing ggml) keeps it; else ggml's messages go to
    // stderr without its debug ones (ggml-cuda reports every CUDA graph it replays, a line a
    // step).
    ggml_log_callback before = nullptr;
    void *before_data = nullptr;
    ggml_log_get(&before, &before_data);
    ggml_log_callback ggml_default = nullptr;
    void *unused = nullptr;
    ggml_log_set(nullptr, nullptr); // installs ggml's default: its address tells it apart
    ggml_log_get(&ggml_default, &unused);
    static std::string captured;
    ggml_log_set(
        [](ggml_log_level level, const char *text, void *) {
          thread_local bool kept = false; // CONT continues the message before it
          if (level != GGML_LOG_LEVEL_CONT)
            kept = level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN;
          if (kept) captured += text;
        },
        nullptr);
    (void)ggml_backend_dev_count();
    if (before != ggml_default) {
      ggml_log_set(before, before_data);
      return captured;
    }
    ggml_log_set(
        [](ggml_log_level level, const char *text, void *) {
          thread_local bool debug = false;
          if (level != GGML_LOG_LEVEL_CONT) debug = level == GGML_LOG_LEVEL_DEBUG;
          if (!debug) std::fputs(text, stderr);
        },
        nullptr);
    return captured;
  }();
  return log;
}

bool is_gpu(ggml_backend_dev_t dev) {
  const auto type = ggml_backend_dev_type(dev);
  return type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU;
}

} // namespace

std::vector<ggml_backend_dev_t> Devices::local_gpus() {
  (void)registry_log();
  std::vector<ggml_backend_dev_t> out;
  for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    // RPC servers register as GPUs too: they are named by --rpc, not found.
    const std::string reg = ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev));
    if (is_gpu(dev) && reg != "RPC") out.push_back(dev);
  }
  return out;
}

std::string Devices::why_no_gpu() {
  const std::string &log = registry_log();
  bool has_gpu_backend = false;
  for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
    const std::string name = ggml_backend_reg_name(ggml_backend_reg_get(i));
    if (name != "CPU" && name != "RPC") has_gpu_backend = true;
  }
  if (!has_gpu_backend)
    return "this build has no GPU backend (build the CUDA variant: make cuda, docs/gpu.md)";
  std::string reason = log;
  while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
  if (reason.empty()) reason = "the GPU backend found no device";
  return reason;
}

std::string Devices::describe_available() {
  std::string out;
  const auto gpus = local_gpus();
  for (ggml_backend_dev_t dev : gpus) {
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(dev, &free, &total);
    out += std::string(ggml_backend_dev_name(dev)) + ": " + ggml_backend_dev_description(dev) +
           " (" + mib(total) + ", " + mib(free) + " free)\n";
  }
  if (gpus.empty()) out += "no GPU: " + why_no_gpu() + "\n";
  // Whether q8_0 multiplies take offgraph's own kernels here (model/cpu_matmul.h), or why not.
  out += "CPU: " +
         std::string(
             ggml_backend_dev_description(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU))) +
         (amx_available() ? " (AMX tiles for q8_0)"
                          : " (no AMX tiles: " + amx_unavailable_reason() + ")") +
         (row_dot_available() ? " (row-dot kernel for q8_0 decode)"
                              : " (no row-dot kernel: " + row_dot_unavailable_reason() + ")") +
         "\n";
  return out;
}

Result<std::shared_ptr<const Devices>> Devices::open(const DeviceOptions &options) {
  auto d = std::make_shared<Devices>();
  // The local GPUs: those named (each must exist), or every one found.
  std::vector<ggml_backend_dev_t> gpus;
  if (options.gpus) {
    const auto found = local_gpus();
    for (const std::string &name : *options.gpus) {
      auto it = std::find_if(found.begin(), found.end(), [&](ggml_backend_dev_t dev) {
        return name == ggml_backend_dev_name(dev);
      });
      if (it == found.end()) {
        std::string known;
        for (ggml_backend_dev_t dev : found)
          known += (known.empty() ? "" : ", ") + std::string(ggml_backend_dev_name(dev));
        return Status::error("device '" + name + "' is not a GPU of this machine (" +
                             (known.empty() ? "none: " + why_no_gpu() : "found: " + known) + ")");
      }
      if (std::find(gpus.begin(), gpus.end(), *it) != gpus.end())
        return Status::error("device '" + name + "' is named twice");
      gpus.push_back(*it);
    }
  } else {
    gpus = local_gpus();
  }
  const size_t n_rpc = options.rpc.size(), n_off = gpus.size() + n_rpc;
  // Proportions for RPC servers meant servers (and the CPU) before GPUs joined the list: where
  // GPUs were found rather than named, their order would change silently.
  if (!options.gpus && !gpus.empty() && n_rpc > 0 && !options.split.empty())
    return Status::error("tensor split with --rpc on a machine with GPUs: name the GPUs with "
                         "--device (or --device none), so that the proportions are read as the "
                         "named GPUs', then the servers'");
  // Everything that can be checked without a connection first.
  const bool cpu_share = options.split.size() == n_off + 1;
  if (!options.split.empty() && options.split.size() != n_off && !cpu_share)
    return Status::error("tensor split: " + std::to_string(options.split.size()) +
                         " proportions for " + std::to_string(gpus.size()) + " GPUs and " +
                         std::to_string(n_rpc) +
                         " RPC endpoints; give one per device, or one more for the local CPU");
  if (!options.split.empty() && n_off == 0)
    return Status::error("tensor split: without GPUs or --rpc there is only the CPU to split over");
  if (cpu_share && options.n_gpu_layers >= 0)
    return Status::error("tensor split: a proportion for the CPU and -ngl both place the CPU's "
                         "layers; give one or the other");
  if (options.n_gpu_layers < -1)
    return Status::error("-ngl: " + std::to_string(options.n_gpu_layers) +
                         " layers; give a count >= 0 or 'all'");
  float sum = 0;
  for (float f : options.split) {
    if (!std::isfinite(f) || f < 0)
      return Status::error("tensor split: proportions must be finite and >= 0");
    sum += f;
  }
  if (!options.split.empty() && sum <= 0)
    return Status::error("tensor split: the proportions add up to 0");
  for (ggml_backend_dev_t dev : gpus) {
    d->devices_.push_back(dev);
    d->endpoints_.emplace_back();
    d->relays_.emplace_back();
  }
  // Each endpoint resolved once, here: the relay connects to this address and no other.
  std::vector<sockaddr_in> addresses;
  for (const std::string &ep : options.rpc) {
    auto checked = checked_address(ep, options.allow_remote);
    if (!checked.ok()) return checked.status();
    const sockaddr_in sa = *checked;
    // A server serves one client at a time: the same one twice would wait for itself (caught
    // here when both names resolve to one address; two addresses of one machine are caught by
    // the relay's handshake timeout).
    for (size_t j = 0; j < addresses.size(); ++j)
      if (addresses[j].sin_addr.s_addr == sa.sin_addr.s_addr &&
          addresses[j].sin_port == sa.sin_port)
        return Status::error("RPC endpoints '" + options.rpc[j] + "' and '" + ep +
                             "' are the same server");
    addresses.push_back(sa);
  }
  for (size_t i = 0; i < n_rpc; ++i) {
    const std::string &ep = options.rpc[i];
    OFFGRAPH_TRY(probe(addresses[i].sin_addr, ntohs(addresses[i].sin_port), ep));
    std::string error;
    auto relay = RpcRelay::start(addresses[i], &error);
    if (!relay) return Status::error("RPC endpoint '" + ep + "': " + error);
    ggml_backend_reg_t reg = ggml_backend_rpc_add_server(relay->endpoint().c_str());
    if (relay->failed()) return Status::error("RPC endpoint '" + ep + "': " + relay->failure());
    if (!reg || ggml_backend_reg_dev_count(reg) == 0)
      return Status::error("RPC endpoint '" + ep + "' offers no device");
    // A server exposes the devices it was started with; offgraph places layers on its first.
    d->devices_.push_back(ggml_backend_reg_dev_get(reg, 0));
    d->endpoints_.push_back(ep);
    d->relays_.push_back(std::move(relay));
  }
  d->devices_.push_back(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
  d->endpoints_.emplace_back();
  d->relays_.emplace_back();
  std::vector<float> w = options.split;
  if (w.empty()) w.assign(n_off, 1.0f);
  w.resize(n_off + 1, 0.0f); // the CPU's, unless given
  if (n_off == 0) w = {1.0f};
  float total = 0;
  for (float &x : w) x = (total += x);
  for (float &x : w) x /= total;
  d->shares_ = std::move(w);
  d->n_gpu_layers_ = n_off == 0 ? -1 : options.n_gpu_layers;
  return std::shared_ptr<const Devices>(std::move(d));
}

std::shared_ptr<const Devices> Devices::cpu_only() {
  DeviceOptions none;
  none.gpus.emplace();
  static const std::shared_ptr<const Devices> cpu = *Devices::open(none);
  return cpu;
}

ggml_backend_buffer_type_t Devices::buffer_type(int32_t d) const {
  return is_cpu(d) ? ggml_backend_cpu_buffer_type() : ggml_backend_dev_buffer_type(device(d));
}

std::string Devices::name(int32_t d) const {
  if (is_cpu(d)) return "CPU";
  return std::string(ggml_backend_dev_name(device(d))) + " (" +
         (endpoint(d).empty() ? ggml_backend_dev_description(device(d)) : endpoint(d)) + ")";
}

std::string Devices::name_of(ggml_backend_buffer_type_t buft) const {
  for (int32_t d = 0; d < size(); ++d)
    if (!is_cpu(d) && buffer_type(d) == buft) return name(d);
  return ggml_backend_buft_is_host(buft) ? "CPU" : ggml_backend_buft_name(buft);
}

std::string Devices::failure() const {
  for (int32_t i = 0; i < size(); ++i)
    if (failed(i)) return name(i) + ": " + relays_[size_t(i)]->failure();
  return "";
}

void Devices::interrupt(const std::string &why) const {
  for (const auto &relay : relays_)
    if (relay) relay->interrupt(why);
}

bool Devices::failed(int32_t d) const { return relays_[size_t(d)] && relays_[size_t(d)]->failed(); }

std::vector<int32_t> Devices::assign(int32_t n_layer) const {
  std::vector<int32_t> out(size_t(n_layer) + 1);
  // -ngl N: the first n_layer + 1 - N slots on the CPU, the rest split over the others.
  const int32_t slots = n_layer + 1;
  const int32_t offloaded = n_gpu_layers_ < 0 ? slots : std::min(n_gpu_layers_, slots);
  const int32_t on_cpu = slots - offloaded;
  for (int32_t i = 0; i <= n_layer; ++i) {
    if (i < on_cpu) {
      out[size_t(i)] = cpu();
      continue;
    }
    const float at = float(i - on_cpu) / float(offloaded);
    out[size_t(i)] =
        int32_t(std::upper_bound(shares_.begin(), shares_.end(), at) - shares_.begin());
    out[size_t(i)] = std::min(out[size_t(i)], cpu());
  }
  return out;
}

} // namespace offgraph::model
