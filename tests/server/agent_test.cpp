// The agent pattern over HTTP on a sliding-window model (window 32, prompts many windows long): six
// turns, each resending the whole history with the previous answer (its reasoning dropped by the
// template), a tool call and its result. With prefix reuse each turn computes only what follows
// the previous prompt (the snapshot at its end brings the rings back), answers exactly as a server
// that recomputes everything, and the rings never grow past window + max_write - 1 rows.
#include "live_server.h"

#include <chrono>
#include <cstdio>
#include <thread>

namespace offgraph::server::testing {
namespace {

json agent_tools() {
  return json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "search_flights"},
          {"description", "Search flights between two airports on a date"},
          {"parameters",
           {{"type", "object"},
            {"properties",
             {{"from", {{"type", "string"}, {"description", "IATA code of the departure"}}},
              {"to", {{"type", "string"}, {"description", "IATA code of the arrival"}}},
              {"date", {{"type", "string"}, {"description", "YYYY-MM-DD"}}}}},
            {"required", {"from", "to", "date"}}}}}}},
       {{"type", "function"},
        {"function",
         {{"name", "book_hotel"},
          {"description", "Book a hotel room in a city for a number of nights"},
          {"parameters",
           {{"type", "object"},
            {"properties",
             {{"city", {{"type", "string"}}},
              {"nights", {{"type", "integer"}}},
              {"budget_eur", {{"type", "number"}}}}},
            {"required", {"city", "nights"}}}}}}}});
}

struct Turn {
  int prompt = 0, cached = 0, computed = 0, completion = 0;
  json message;
};

// Runs the six-turn conversation against `run`, returning what each turn cost and answered.
std::vector<Turn> converse(Running &run) {
  json messages = json::array(
      {{{"role", "system"},
        {"content", "You are a meticulous travel agent. Always check flights before booking "
                    "hotels, keep a running budget in euros, and explain each step briefly. "
                    "Prefer direct flights and central hotels; never book without a date."}},
       {{"role", "user"},
        {"content", "Plan a five-day trip from Berlin to Lisbon and Porto in May for two people "
                    "with a total budget of 2400 euros."}}});
  const std::vector<std::pair<std::string, json>> calls = {
      {"search_flights", {{"from", "BER"}, {"to", "LIS"}, {"date", "2027-05-03"}}},
      {"book_hotel", {{"city", "Lisbon"}, {"nights", 3}, {"budget_eur", 600}}},
      {"search_flights", {{"from", "LIS"}, {"to", "OPO"}, {"date", "2027-05-06"}}},
      {"book_hotel", {{"city", "Porto"}, {"nights", 2}, {"budget_eur", 400}}},
      {"search_flights", {{"from", "OPO"}, {"to", "BER"}, {"date", "2027-05-08"}}}};
  std::vector<Turn> turns;
  for (int t = 0; t < 6; ++t) {
    const double computed_before = run.metric("offgraph_prompt_tokens_computed_total");
    json req = {{"messages", messages},
                {"tools", agent_tools()},
                {"max_tokens", 40},
                {"temperature", 0},
                {"reasoning_effort", "medium"}};
    auto [status, body] = run.post("/v1/chat/completions", req);
    EXPECT_EQ(status, 200) << body.dump();
    if (status != 200) break;
    Turn turn;
    turn.prompt = body["usage"]["prompt_tokens"];
    turn.cached = body["usage"]["prompt_tokens_details"]["cached_tokens"];
    turn.completion = body["usage"]["completion_tokens"];
    turn.message = body["choices"][0]["message"];
    // Metrics are published after each step; wait until this request's step is counted.
    for (int i = 0; i < 100 && run.metric("offgraph_sequences_active") != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    turn.computed = int(run.metric("offgraph_prompt_tokens_computed_total") - computed_before);
    // Rings of window 32 + max_write 32 - 1 rows, never more (none at all when nothing is held).
    const double ring_rows = run.metric("offgraph_kv_ring_rows");
    EXPECT_EQ(ring_rows, run.metric("offgraph_sequences_held") > 0 ? 63 : 0);
    EXPECT_EQ(run.metric("offgraph_kv_ring_rows_design"), 63);
    turns.push_back(turn);
    if (t == 5) break;
    // The agent's next request: its answer (with the reasoning, which the template drops), the
    // tool call it made and the tool's result.
    const auto &[name, args] = calls[size_t(t)];
    json assistant = {{"role", "assistant"},
                      {"content", turn.message.value("content", "")},
                      {"tool_calls",
                       {{{"id", "call_" + std::to_string(t)},
                         {"type", "function"},
                         {"function", {{"name", name}, {"arguments", args.dump()}}}}}}};
    if (turn.message.contains("reasoning_content"))
      assistant["reasoning_content"] = turn.message["reasoning_content"];
    messages.push_back(assistant);
    messages.push_back(
        {{"role", "tool"},
         {"tool_call_id", "call_" + std::to_string(t)},
         {"name", name},
         {"content", json{{"ok", true}, {"turn", t}, {"price_eur", 180 + 35 * t}}.dump()}});
  }
  return turns;
}

TEST(AgentLoop, SixTurnsComputeOnlyWhatIsNewAndAnswerAsWithoutReuse) {
  const std::string path = make_model(32, 21, "agent");
  auto model = std::move(model::Model::load(path)).value();
  engine::EngineOptions eo = small_engine(4096, 32);
  eo.max_cached = 4;
  std::vector<Turn> with, without;
  {
    Running run(*model, eo, opts("reuse"));
    with = converse(run);
  }
  {
    engine::EngineOptions off = eo;
    off.prefix_reuse = false;
    Running run(*model, off, opts("no-reuse"));
    without = converse(run);
  }
  // With reuse the conversation stays cached, so the ring check above saw real rings.
  ASSERT_EQ(with.size(), 6u);
  ASSERT_EQ(without.size(), 6u);
  std::printf(
      "[ agent    ] turn  prompt  new-since-last  computed(reuse)  computed(none)  cached\n");
  int64_t sum_with = 0, sum_without = 0;
  for (size_t t = 0; t < 6; ++t) {
    const int fresh = t == 0 ? with[t].prompt : with[t].prompt - with[t - 1].prompt;
    std::printf("[ agent    ] %4zu  %6d  %14d  %15d  %14d  %6d\n", t + 1, with[t].prompt, fresh,
                with[t].computed, without[t].computed, with[t].cached);
    sum_with += with[t].computed, sum_without += without[t].computed;
    EXPECT_EQ(with[t].message, without[t].message) << "turn " << t + 1;
    EXPECT_EQ(with[t].completion, without[t].completion) << "turn " << t + 1;
    EXPECT_EQ(without[t].computed, without[t].prompt) << "turn " << t + 1;
    EXPECT_GT(with[t].prompt, 16 * 32 / 2); // several windows long
    if (t > 0) {
      EXPECT_GT(fresh, 0);
      EXPECT_LE(with[t].computed, fresh + 2) << "turn " << t + 1;
      EXPECT_EQ(with[t].cached, with[t].prompt - with[t].computed) << "turn " << t + 1;
    }
  }
  std::printf("[ agent    ] prompt tokens computed over six turns: %lld with reuse, %lld without\n",
              (long long)sum_with, (long long)sum_without);
  fs::remove(path);
}

} // namespace
} // namespace offgraph::server::testing
