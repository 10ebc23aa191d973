#include "server/metrics.h"

#include <cstdio>

namespace offgraph::server {

KvMetrics kv_metrics(const kv::KvStore &store) {
  KvMetrics m;
  const kv::MemoryUse use = store.memory();
  m.flat = use.flat, m.ring = use.ring, m.snapshots = use.snapshots, m.k = use.k, m.v = use.v;
  m.pages = use.pages, m.shared_pages = use.shared_pages, m.page_bytes = store.page_bytes();
  m.held = use.held, m.minimum = use.minimum, m.buffers = use.buffers;
  m.free_warm_pages = store.pages().free_warm();
  m.k_type = kv::storage_type_name(store.types().k);
  m.v_type = kv::storage_type_name(store.types().v);
  const cache::Layout &layout = store.layout();
  for (cache::CacheId c = 0; c < layout.n_caches(); ++c)
    if (layout.cache(c).ring())
      m.ring_rows_design =
          std::max(m.ring_rows_design, layout.cache(c).window() + layout.ring_lead() - 1);
  const auto ids = store.sequence_ids();
  m.sequences = int32_t(ids.size());
  for (kv::SeqId id : ids)
    for (cache::CacheId c = 0; c < layout.n_caches(); ++c)
      if (layout.cache(c).ring() && store.k_storage(id, c))
        m.ring_rows_max = std::max(m.ring_rows_max, store.storage_rows(id, c));
  return m;
}

namespace {

class Writer {
public:
  void family(const char *name, const char *type, const char *help) {
    text_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const char *name, double v, const std::string &labels = "") {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    text_ += std::string(name) + (labels.empty() ? "" : "{" + labels + "}") + " " + buf + "\n";
  }
  void one(const char *name, const char *type, const char *help, double v) {
    family(name, type, help);
    sample(name, v);
  }
  std::string take() { return std::move(text_); }

private:
  std::string text_;
};

} // namespace

std::string render_metrics(const MetricsInput &in, const HttpCounters &http) {
  Writer w;
  const engine::EngineStats &e = in.engine;
  w.one("offgraph_ready", "gauge", "1 once the model is loaded", in.ready);
  w.one("offgraph_requests_total", "counter", "completion requests accepted",
        double(http.requests));
  w.one("offgraph_requests_completed_total", "counter", "completion requests answered in full",
        double(http.completed));
  w.one("offgraph_requests_rejected_total", "counter", "requests refused with 429 (queue full)",
        double(http.rejected));
  w.one("offgraph_requests_client_errors_total", "counter",
        "requests refused with a 4xx status (not 499: nobody read those)",
        double(http.client_errors));
  w.one("offgraph_requests_server_errors_total", "counter", "requests answered with a 5xx status",
        double(http.server_errors));
  w.one("offgraph_requests_unauthorized_total", "counter", "requests without a valid API key",
        double(http.unauthorized));
  w.one("offgraph_client_disconnects_total", "counter",
        "requests cancelled because their client went away", double(http.disconnects));
  w.one("offgraph_requests_abandoned_total", "counter",
        "requests whose client went away before they were accepted (waiting for image memory)",
        double(http.abandoned));
  w.one("offgraph_dropped_tools_total", "counter",
        "hosted tools left out of Responses requests (--drop-hosted-tools)",
        double(http.dropped_tools));
  w.one("offgraph_prompt_tokens_total", "counter", "prompt tokens of admitted requests (in)",
        double(e.prompt_tokens));
  w.one("offgraph_prompt_tokens_computed_total", "counter", "prompt tokens computed",
        double(e.computed_prompt_tokens));
  w.one("offgraph_prompt_tokens_cached_total", "counter",
        "prompt tokens reused from cached conversations (computation saved)",
        double(e.reused_prompt_tokens));
  w.one("offgraph_prefix_cache_hits_total", "counter",
        "requests that reused a cached conversation's prefix", double(e.prefix_hits));
  w.one("offgraph_snapshot_restores_total", "counter", "ring snapshots restored for prefix reuse",
        double(e.snapshot_restores));
  w.one("offgraph_failed_forks_total", "counter",
        "forks for prefix reuse that could not be made (a snapshot or the prompt served instead)",
        double(e.failed_forks));
  w.one("offgraph_step_memory_faults_total", "counter",
        "steps whose every request ended because memory no fault site contains could not be had",
        double(e.step_memory_faults));
  w.one("offgraph_lost_end_events_total", "counter",
        "requests whose last event the server could not take (out of memory, 16 steps running)",
        double(e.lost_end_events));
  w.one("offgraph_compute_budget_refusals_total", "counter",
        "step graphs that needed more than the compute budget (--compute-mib) and ran smaller",
        double(e.compute_budget_refusals));
  w.one("offgraph_cache_evictions_total", "counter",
        "cached conversations dropped for room (count, bytes or memory)",
        double(e.cache_evictions));
  w.one("offgraph_snapshot_evictions_total", "counter",
        "snapshots dropped (for bytes, or with the last sequence through them)",
        double(e.snapshot_evictions));
  w.one("offgraph_prefix_tree_nodes", "gauge", "nodes of the prefix tree", double(in.tree_nodes));
  w.one("offgraph_prefix_tree_snapshots", "gauge", "ring snapshots held in the prefix tree",
        double(in.snapshots));
  w.one("offgraph_generated_tokens_total", "counter", "tokens generated (out)",
        double(e.generated_tokens));
  w.one("offgraph_steps_total", "counter", "engine steps", double(e.steps));
  w.one("offgraph_prefill_seconds_total", "counter", "forward time spent on prompt tokens",
        e.prefill_seconds);
  w.one("offgraph_decode_seconds_total", "counter", "forward time spent on generated tokens",
        e.decode_seconds);
  w.one("offgraph_prefill_tokens_per_second", "gauge", "prompt tokens computed per second",
        e.prefill_seconds > 0 ? double(e.computed_prompt_tokens) / e.prefill_seconds : 0);
  w.one("offgraph_decode_tokens_per_second", "gauge", "tokens generated per second",
        e.decode_seconds > 0 ? double(e.generated_tokens) / e.decode_seconds : 0);
  // Speculative decoding, by draft source (llama-server: spec_decode_num_*_total).
  const std::pair<const char *, const engine::DraftStats *> drafters[] = {{"ngram", &e.ngram},
                                                                          {"draft", &e.draft}};
  auto per_drafter = [&](const char *name, const char *type, const char *help,
                         double (*value)(const engine::DraftStats &)) {
    w.family(name, type, help);
    for (const auto &[drafter, d] : drafters)
      w.sample(name, value(*d), std::string("drafter=\"") + drafter + "\"");
  };
  per_drafter("offgraph_spec_verifications_total", "counter",
              "verify spans run (a decode step that checked drafted tokens)",
              [](const engine::DraftStats &d) { return double(d.verifications); });
  per_drafter("offgraph_spec_drafted_tokens_total", "counter", "drafted tokens verified",
              [](const engine::DraftStats &d) { return double(d.drafted); });
  per_drafter("offgraph_spec_accepted_tokens_total", "counter", "drafted tokens kept",
              [](const engine::DraftStats &d) { return double(d.accepted); });
  per_drafter("offgraph_spec_acceptance_rate", "gauge", "drafted tokens kept / drafted tokens",
              [](const engine::DraftStats &d) {
                return d.drafted > 0 ? double(d.accepted) / double(d.drafted) : 0.0;
              });
  per_drafter("offgraph_spec_tokens_per_step", "gauge",
              "tokens one verify span yields: (accepted + verifications) / verifications",
              [](const engine::DraftStats &d) {
                return d.verifications > 0
                           ? double(d.accepted + d.verifications) / double(d.verifications)
                           : 0.0;
              });
  if (!in.devices.empty()) {
    auto per_device = [&](const char *name, const char *type, const char *help, auto value) {
      w.family(name, type, help);
      for (const MetricsInput::Device &d : in.devices)
        w.sample(name, double(value(d)), "device=\"" + d.name + "\"");
    };
    per_device("offgraph_rpc_bytes_sent_total", "counter",
               "bytes sent to the device's ggml-rpc-server",
               [](const MetricsInput::Device &d) { return d.sent; });
    per_device("offgraph_rpc_bytes_received_total", "counter",
               "bytes received from the device's ggml-rpc-server",
               [](const MetricsInput::Device &d) { return d.received; });
    per_device("offgraph_rpc_up", "gauge", "1 while the device's server answers",
               [](const MetricsInput::Device &d) { return d.up ? 1 : 0; });
  }
  w.one("offgraph_decode_spans_total", "counter",
        "a sequence's decode in one step (one token, or a verify span)", double(e.decode_spans));
  w.one("offgraph_queue_depth", "gauge", "requests waiting for a place", double(in.queued));
  w.one("offgraph_waits_for_memory_total", "counter",
        "steps in which the next request waited for KV memory", double(e.waits_for_memory));
  w.one("offgraph_sequences_active", "gauge", "sequences being computed (choices included)",
        double(in.active));
  w.one("offgraph_sequences_cached", "gauge", "finished conversations kept for prefix reuse",
        double(in.cached));
  w.one("offgraph_sequences_held", "gauge", "sequences holding KV storage",
        double(in.kv.sequences));
  w.one("offgraph_cached_conversation_bytes", "gauge",
        "KV bytes held by cached conversations and their snapshots", double(in.cached_bytes));

  w.one("offgraph_grammar_tables", "gauge",
        "grammar mask tables shared by constrained requests (the startup warm-up's included)",
        double(in.grammar_tables));
  w.one("offgraph_grammar_table_bytes", "gauge", "bytes of those tables",
        double(in.grammar_table_bytes));

  w.family("offgraph_kv_bytes", "gauge", "KV bytes held, by cache kind (snapshots apart)");
  w.sample("offgraph_kv_bytes", double(in.kv.flat), "kind=\"flat\"");
  w.sample("offgraph_kv_bytes", double(in.kv.ring), "kind=\"ring\"");
  w.sample("offgraph_kv_bytes", double(in.kv.snapshots), "kind=\"snapshot\"");
  w.family("offgraph_kv_tensor_bytes", "gauge", "KV bytes held, by tensor and storage type");
  w.sample("offgraph_kv_tensor_bytes", double(in.kv.k),
           "tensor=\"k\",dtype=\"" + in.kv.k_type + "\"");
  w.sample("offgraph_kv_tensor_bytes", double(in.kv.v),
           "tensor=\"v\",dtype=\"" + in.kv.v_type + "\"");
  w.one("offgraph_kv_buffer_bytes", "gauge", "KV backend buffers, alignment included",
        double(in.kv.buffers));
  w.one("offgraph_kv_pages", "gauge", "flat KV pages in use (each counted once)",
        double(in.kv.pages));
  w.one("offgraph_kv_pages_shared", "gauge", "flat KV pages held by more than one sequence",
        double(in.kv.shared_pages));
  w.one("offgraph_kv_pages_free_warm", "gauge",
        "free flat KV pages whose memory the process keeps for reuse (the others' memory went "
        "back to the OS)",
        double(in.kv.free_warm_pages));
  w.one("offgraph_kv_page_bytes", "gauge", "bytes of one flat KV page (all flat caches, K and V)",
        double(in.kv.page_bytes));
  w.one("offgraph_kv_min_bytes", "gauge",
        "the theoretical minimum of KV bytes for the lengths held", double(in.kv.minimum));
  w.one("offgraph_kv_budget_bytes", "gauge", "the KV memory budget (0: none)",
        double(in.kv_budget));
  w.one("offgraph_kv_ring_rows", "gauge", "rows of the largest ring any sequence holds",
        double(in.kv.ring_rows_max));
  w.one("offgraph_kv_ring_rows_design", "gauge",
        "window + min(ring reach, max_write - 1): the ring size sliding layers need",
        double(in.kv.ring_rows_design));
  w.family("offgraph_memory_used_bytes", "gauge",
           "bytes counted against each memory budget now (docs/reliability.md)");
  for (const MetricsInput::Budget &b : in.budgets)
    w.sample("offgraph_memory_used_bytes", double(b.used),
             "budget=\"" + b.name + "\",flag=\"" + b.flag + "\"");
  w.family("offgraph_memory_budget_bytes", "gauge", "each memory budget (0: none)");
  for (const MetricsInput::Budget &b : in.budgets)
    w.sample("offgraph_memory_budget_bytes", double(b.limit),
             "budget=\"" + b.name + "\",flag=\"" + b.flag + "\"");
  if (!in.device_memory.empty()) {
    w.family("offgraph_device_memory_bytes", "gauge",
             "bytes each device holds, by use: weights, kv, draft_kv, compute");
    for (const MetricsInput::DeviceMemory &d : in.device_memory)
      w.sample("offgraph_device_memory_bytes", double(d.bytes),
               "device=\"" + d.device + "\",use=\"" + d.use + "\"");
  }
  if (!in.device_budgets.empty()) {
    w.family("offgraph_device_memory_budget_bytes", "gauge",
             "each device's part of a memory budget, by use: kv, draft_kv (in proportion to the "
             "caches it holds)");
    for (const MetricsInput::DeviceMemory &d : in.device_budgets)
      w.sample("offgraph_device_memory_budget_bytes", double(d.bytes),
               "device=\"" + d.device + "\",use=\"" + d.use + "\"");
  }
  return w.take();
}

} // namespace offgraph::server
