#include "commands.h"
#include "device_flags.h"
#include "image_flags.h"
#include "speculation_flags.h"

#include "base/units.h"
#include "kv/storage_types.h"
#include "server/server.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>

namespace offgraph::cli {

namespace {
// Set by SIGINT/SIGTERM; the main thread sees it and shuts the server down (a signal handler
// may not take locks or join threads).
volatile std::sig_atomic_t stop_requested = 0;
void on_signal(int) { stop_requested = 1; }

// The compute budget of each device, beside what one token's step and a full prefill chunk at
// the full context need there (measured at start).
void print_compute_budget(const engine::Engine &engine, bool explicit_budget,
                          const model::Devices &devices) {
  const engine::Engine::ComputeNeeds &needs = engine.compute_needs();
  bool any = false;
  for (const engine::Engine::Load::DeviceBytes &b : engine.budget_by_device()) {
    if (std::string(b.use) != "compute") continue;
    any = true;
    const int64_t one = kv::bytes_on(needs.one_token, b.buft),
                  full = kv::bytes_on(needs.full_chunk, b.buft);
    std::fprintf(stderr,
                 "offgraph serve: compute budget on %s %s%s; at the full context one token's "
                 "step needs %s, a full prefill chunk %s%s\n",
                 devices.name_of(b.buft).c_str(), mib(b.bytes).c_str(),
                 explicit_budget ? "" : " (1/8 of the memory available)", mib(one).c_str(),
                 mib(full).c_str(), full > b.bytes ? ": long prompts run in smaller chunks" : "");
  }
  if (!any)
    std::fprintf(stderr, "offgraph serve: compute budget none (%s)\n",
                 explicit_budget ? "--compute-mib 0" : "the memory available is unknown");
}
} // namespace

std::function<int()> add_serve(CLI::App &app) {
  struct Opts {
    std::string model, host = "127.0.0.1", ctk = "f16", ctv = "f16", api_key, cors;
    std::vector<std::string> aliases;
    int port = 8080, ctx = 8192, parallel = 4, batch = 256, threads = 2, cached = 8;
    int snapshot_every = 0, kv_page = 64, ring_reach = cache::Policy{}.ring_reach;
    bool no_start_snapshots = false;
    double snapshot_budget_mib = 0;
    int queue = 64, timeout = 600, read_timeout = 30, idle_timeout = 5, http_threads = 64,
        max_tokens = 0;
    double cache_budget_mib = 0;
    std::optional<double> kv_budget_mib;      // unset: from the memory available (engine.h)
    std::optional<double> compute_budget_mib; // likewise
    std::optional<double> max_body_mib;       // unset: 8, or 64 with --mmproj
    int max_images = 8;
    double grammar_mib = 256;
    int responses_store = 64;
    bool drop_hosted_tools = false;
    ImageFlags images;
    bool no_prefix_reuse = false;
    SpeculationFlags spec;
    DeviceFlags devices;
  };
  auto o = std::make_shared<Opts>();
  CLI::App *cmd = app.add_subcommand("serve", "an OpenAI-compatible HTTP server");
  cmd->add_option("-m,--model", o->model, "the GGUF model (default: the shipped model)");
  cmd->add_option("--host", o->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "port")->capture_default_str();
  cmd->add_option("--alias", o->aliases,
                  "model id in responses (default: the file's general.name); repeat it for more "
                  "names requests may give; a trailing * takes every name that begins so "
                  "('claude-*': the names Claude Code sends for its side tasks)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--api-key", o->api_key,
                  "require 'Authorization: Bearer KEY' on every route but /health (also "
                  "$OFFGRAPH_API_KEY)")
      ->envname("OFFGRAPH_API_KEY");
  cmd->add_option("--cors", o->cors, "allow browser requests from this origin ('*': any)");
  cmd->add_option("-c,--ctx", o->ctx, "context per sequence: prompt + answer")
      ->capture_default_str();
  cmd->add_option("--parallel", o->parallel, "sequences computed together")->capture_default_str();
  cmd->add_option("--queue", o->queue, "requests waiting beyond those; more get 429")
      ->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens,
                  "the most tokens one request may generate (0: the context)")
      ->capture_default_str();
  cmd->add_option("--max-body-mib", o->max_body_mib,
                  "largest request body (default: 8, or 64 with --mmproj: images come base64 "
                  "in the body)");
  add_image_flags(*cmd, o->images, true);
  cmd->add_option("--grammar-mib", o->grammar_mib,
                  "MiB of grammar mask tables shared by structured-output requests, the least "
                  "recently used dropped past it (a grammar in use keeps its own)")
      ->capture_default_str();
  cmd->add_option("--max-images", o->max_images, "image parts one request may hold")
      ->capture_default_str();
  cmd->add_option("--timeout", o->timeout, "seconds to write a response")->capture_default_str();
  cmd->add_option("--read-timeout", o->read_timeout, "seconds to read a request")
      ->capture_default_str();
  cmd->add_option("--idle-timeout", o->idle_timeout,
                  "seconds a keep-alive connection may wait for its next request")
      ->capture_default_str();
  cmd->add_option("--http-threads", o->http_threads, "connections served at once")
      ->capture_default_str();
  cmd->add_option("--cache-seqs", o->cached, "finished conversations kept for prefix reuse")
      ->capture_default_str();
  cmd->add_option("--cache-mib", o->cache_budget_mib,
                  "KV memory the kept conversations may hold (0: no byte limit)")
      ->capture_default_str();
  cmd->add_option("--kv-mib", o->kv_budget_mib,
                  "KV memory in all (sequences, cached conversations, snapshots); requests wait "
                  "until theirs fits, one that never can is refused (default: three quarters of "
                  "the memory available once the weights are in, at most the page pool; 0: no "
                  "limit)");
  cmd->add_option("--compute-mib", o->compute_budget_mib,
                  "memory each device's compute buffers may hold (the graphs' intermediate "
                  "tensors; grows with the tokens of a step and the depth of its history): larger "
                  "steps run in smaller ones to stay inside it; refused at start if one token at "
                  "the full context does not fit (default: an eighth of the memory each device "
                  "may still take, at least that one token's step; 0: no limit)");
  cmd->add_flag("--no-prefix-reuse", o->no_prefix_reuse, "compute every prompt from scratch");
  cmd->add_option("--responses-store", o->responses_store,
                  "Responses API: responses kept in memory for previous_response_id and GET "
                  "/v1/responses/{id}, least recently used dropped first (0: none; store: true "
                  "is then refused)")
      ->capture_default_str();
  cmd->add_flag("--drop-hosted-tools", o->drop_hosted_tools,
                "Responses API: leave hosted tools (web_search, file_search, ...) out of requests "
                "instead of refusing them; each answer names them in X-Offgraph-Dropped-Tools");
  cmd->add_option(
         "--snapshot-every", o->snapshot_every,
         "also keep a ring snapshot every N prompt tokens, and at the end of each "
         "prefill chunk within 16 tokens of a message's start one reaching back over it, so that a "
         "branch inside a long prompt recomputes at most N and an edit near a message's "
         "start nothing before the edit (0: at prompt ends only; each costs window - 1 + "
         "its reach rows per sliding layer, a reach of 16 to max_write: "
         "docs/prefix-cache.md)")
      ->capture_default_str();
  cmd->add_flag(
      "--no-start-snapshots", o->no_start_snapshots,
      "keep no ring snapshots at message starts unless --snapshot-every asks for them (by "
      "default they are kept, so that an edited or regenerated message resumes there)");
  cmd->add_option("--snapshot-mib", o->snapshot_budget_mib,
                  "MiB the ring snapshots may hold together, least recently used dropped first (0: "
                  "the KV of one sequence the length of the context; -1: no limit)")
      ->capture_default_str();
  add_speculation_flags(*cmd, o->spec);
  add_device_flags(*cmd, o->devices);
  cmd->add_option("--kv-page", o->kv_page, "rows of a page of flat KV storage")
      ->capture_default_str();
  cmd->add_option("--ring-reach", o->ring_reach,
                  "rows a sliding layer's ring keeps past its window: how far a rewind, a rejected "
                  "draft or a snapshot may go back once it wrapped (at most --batch - 1 count)")
      ->capture_default_str();
  cmd->add_option("-b,--batch", o->batch, "prefill chunk (max_write)")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "compute threads")->capture_default_str();
  cmd->add_option("--ctk", o->ctk, "K cache type")->capture_default_str();
  cmd->add_option("--ctv", o->ctv, "V cache type")->capture_default_str();
  return [o]() -> int {
    // ggml's OpenMP workers spin between graph nodes by default; in a server they would starve the
    // HTTP threads on a small machine (a first request took 4 s instead of 0.2 s on 2 cores).
    setenv("OMP_WAIT_POLICY", "passive", 0);
    auto fail = [](const std::string &m) {
      return std::fprintf(stderr, "offgraph serve: %s\n", m.c_str()), 1;
    };
    if (o->model.empty()) {
      auto path = default_model();
      if (!path.ok()) return fail(path.message());
      o->model = *path;
    }
    auto ctk = kv::parse_storage_type(o->ctk), ctv = kv::parse_storage_type(o->ctv);
    if (!ctk.ok() || !ctv.ok()) return fail((ctk.ok() ? ctv : ctk).message());
    auto spec = speculation_options(o->spec);
    if (!spec.ok()) return fail(spec.message());
    if (!o->max_body_mib) o->max_body_mib = o->images.mmproj.empty() ? 8 : 64;
    if (!(*o->max_body_mib > 0 && *o->max_body_mib <= 65536) || o->max_images < 1 || o->queue < 0 ||
        o->timeout < 1 || o->read_timeout < 1 || o->idle_timeout < 1 || o->max_tokens < 0 ||
        (o->kv_budget_mib && !(*o->kv_budget_mib >= 0 && *o->kv_budget_mib <= 1e9)) ||
        (o->compute_budget_mib &&
         !(*o->compute_budget_mib >= 0 && *o->compute_budget_mib <= 1e9)) ||
        o->cache_budget_mib < 0 || o->snapshot_every < 0 || o->kv_page < 1 || o->ring_reach < 0)
      return fail("--max-body-mib (at most 65536), --max-images, --kv-page and the timeouts must "
                  "be positive; "
                  "--queue, "
                  "--max-tokens, --kv-mib and --compute-mib (at most 1e9), --cache-mib, "
                  "--snapshot-every and "
                  "--ring-reach not negative");
    server::ServerOptions so;
    so.host = o->host;
    so.port = o->port;
    for (const std::string &a : o->aliases)
      if (a.empty() || a == "*") return fail("--alias: a name (or a prefix before *) is needed");
    // The first is the id answers carry, unless it is a pattern.
    if (!o->aliases.empty() && o->aliases.front().back() != '*') so.model_name = o->aliases.front();
    so.model_aliases = o->aliases;
    so.api_key = o->api_key;
    so.cors_origin = o->cors;
    so.timeout_seconds = o->timeout;
    so.read_timeout_seconds = o->read_timeout;
    so.idle_seconds = o->idle_timeout;
    so.http_threads = o->http_threads;
    so.max_tokens_cap = o->max_tokens;
    so.max_body_bytes = size_t(*o->max_body_mib * 1024 * 1024);
    so.max_images = o->max_images;
    if (!(o->grammar_mib > 0 && o->grammar_mib <= 1e6))
      return fail("--grammar-mib must be positive (at most 1e6)");
    so.grammar_table_bytes = std::max<size_t>(1, size_t(o->grammar_mib * 1048576));
    if (o->responses_store < 0) return fail("--responses-store must not be negative");
    so.responses_store = size_t(o->responses_store);
    so.drop_hosted_tools = o->drop_hosted_tools;
    auto s = server::Server::create_loading(so);
    if (!s.ok()) return fail(s.message());
    // Listening first: /health says 503 while the model loads.
    if (Status st = (*s)->start(); !st.ok()) return fail(st.message());
    if (!(*s)->backlog_status().ok())
      std::fprintf(stderr, "offgraph: warning: %s; bursts of connections may wait\n",
                   (*s)->backlog_status().message().c_str());
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    auto m = load_placed(o->model, o->devices, [](uint64_t d, uint64_t t) {
      if (t > (256u << 20)) progress_bar("loading", d, t);
    });
    if (!m.ok()) return (*s)->stop(), fail(m.message());
    report_placement(**m);
    auto draft = load_draft_model(o->spec, o->model);
    if (!draft.ok()) return (*s)->stop(), fail(draft.message());
    // Declared before the server's guard below: the encoder outlives the server.
    ImageInput images;
    if (!o->images.mmproj.empty()) {
      auto tok = text::Tokenizer::from_gguf(o->model);
      if (!tok.ok()) return (*s)->stop(), fail(tok.message());
      auto in = load_image_input(o->images, **m, **tok, o->threads);
      if (!in.ok()) return (*s)->stop(), fail(in.message());
      images = std::move(in).value();
    }
    // The server (its engine's buffers, on the models' devices) goes before the models: a
    // device's relay must still carry the buffers' frees (model/rpc_relay.h).
    struct ServerFirst {
      std::unique_ptr<server::Server> &server;
      ~ServerFirst() { server.reset(); }
    } server_first{*s};
    engine::EngineOptions eo;
    eo.context = o->ctx;
    eo.max_write = o->batch;
    eo.step_tokens = std::max(o->batch, 512);
    eo.max_active = o->parallel;
    eo.max_cached = o->cached;
    eo.max_queue = size_t(o->queue);
    eo.prefix_reuse = !o->no_prefix_reuse;
    eo.snapshot_every = o->snapshot_every;
    eo.page_rows = o->kv_page;
    eo.ring_reach = o->ring_reach;
    // A tiny positive budget stays positive (0 means none).
    eo.kv_budget = !o->kv_budget_mib ? engine::EngineOptions::kKvBudgetFromMemory
                   : *o->kv_budget_mib > 0
                       ? std::max<int64_t>(1, int64_t(*o->kv_budget_mib * 1048576))
                       : 0;
    eo.compute_budget = !o->compute_budget_mib ? engine::EngineOptions::kComputeBudgetFromMemory
                        : *o->compute_budget_mib > 0
                            ? std::max<int64_t>(1, int64_t(*o->compute_budget_mib * 1048576))
                            : 0;
    eo.cache_budget = int64_t(o->cache_budget_mib * 1024 * 1024);
    eo.start_snapshots = !o->no_start_snapshots;
    if (o->snapshot_budget_mib < 0 && o->snapshot_budget_mib != -1)
      return fail("--snapshot-mib must be -1 (no limit), 0 (the default) or positive");
    // A tiny positive budget stays positive (0 means the default).
    eo.snapshot_budget = o->snapshot_budget_mib < 0 ? -1
                         : o->snapshot_budget_mib > 0
                             ? std::max<int64_t>(1, int64_t(o->snapshot_budget_mib * 1024 * 1024))
                             : 0;
    eo.types = {*ctk, *ctv};
    eo.threads = o->threads;
    eo.speculation = *spec;
    eo.draft_model = draft->get();
    if (Status st = (*s)->attach(**m, eo, {images.encoder.get(), images.markers}); !st.ok())
      return (*s)->stop(), fail(st.message());
    const std::string url = "http://" + o->host + ":" + std::to_string((*s)->port());
    // The KV budget, and how many requests at the full context it holds at once (more wait).
    const engine::Engine &engine = (*s)->engine();
    const int64_t kv_budget = engine.options().kv_budget;
    if (kv_budget > 0) {
      engine::Request full;
      full.prompt.assign(size_t(o->ctx) - 1, 0);
      full.max_tokens = 1;
      const int64_t at_once = kv_budget / std::max<int64_t>(1, engine.peak_kv_bytes(full));
      std::fprintf(stderr,
                   "offgraph serve: KV budget %lld MiB%s: %lld request(s) at the full context "
                   "(-c %d) at once%s\n",
                   (long long)((kv_budget + (1 << 19)) >> 20),
                   o->kv_budget_mib ? "" : " (3/4 of the memory available)", (long long)at_once,
                   o->ctx,
                   at_once < o->parallel ? "; fewer than --parallel: more wait in the queue" : "");
    } else {
      std::fprintf(stderr, "offgraph serve: KV budget none (%s)\n",
                   o->kv_budget_mib ? "--kv-mib 0" : "the memory available is unknown");
    }
    print_compute_budget(engine, o->compute_budget_mib.has_value(), (**m).devices());
    std::fprintf(stderr, "offgraph serve: %s on %s, ready (Ctrl-C stops)\n", o->model.c_str(),
                 url.c_str());
    std::fprintf(stderr,
                 "try:\n  curl %s/v1/chat/completions -H 'Content-Type: application/json'%s "
                 "-d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], "
                 "\"max_tokens\": 64}'\n",
                 url.c_str(), o->api_key.empty() ? "" : " -H \"Authorization: Bearer $KEY\"");
    while (!stop_requested) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::fprintf(stderr, "offgraph serve: stopping (requests in flight end as cancelled)\n");
    (*s)->stop();
    std::fprintf(stderr, "offgraph serve: stopped\n");
    return 0;
  };
}

} // namespace offgraph::cli
