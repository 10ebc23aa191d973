#!/usr/bin/env python3
"""Renders chat templates with Python Jinja2 exactly as Hugging Face transformers does and writes
the inputs and expected outputs to vectors/*.json for the C++ engine's byte-for-byte tests.

Settings copied from transformers' chat-template utilities: ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and the loopcontrols and {% generation %} extensions; `tojson` is plain json.dumps with
ensure_ascii=False; globals raise_exception(msg) and strftime_now(fmt). strftime_now uses a fixed
time (FIXED_NOW) so the vectors are reproducible; the C++ test injects the same time.

Usage: python3 generate_vectors.py   (rewrites vectors/ next to this file)
"""
import datetime
import json
import pathlib

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = pathlib.Path(__file__).resolve().parent
FIXED_NOW = datetime.datetime(2026, 3, 14, 9, 26, 53)


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} extension; when not tracking assistant masks it just
    renders its body (as a call block, so `set` inside stays inside)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render(source, context):
    try:
        return {"expected": ENV.from_string(source).render(**context)}
    except jinja2.exceptions.TemplateError as e:
        return {"expected_error": str(e)}


# ---------------------------------------------------------------------------------------------
# Shared conversation pieces.

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather.get_forecast",
        "description": "Get the forecast for a place. Uses \"metric\" units unless told otherwise.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City, e.g. Zürich"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "units": {"type": "string", "enum": ["metric", "imperial"]},
                "include": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "field": {"type": "string"},
                            "precision": {"type": "number", "default": 0.5},
                        },
                        "required": ["field"],
                    },
                },
            },
            "required": ["location"],
        },
    },
}
ALERTS_TOOL = {
    "type": "function",
    "function": {
        "name": "weather.alerts",
        "description": "Active weather alerts.",
        "parameters": {"type": "object", "properties": {"region": {"type": "string"}}},
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.\nReturns the top results.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"}},
            "required": ["query"],
        },
    },
}
BARE_TOOL = {  # no {"type": "function", "function": ...} wrapper
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
}

FORECAST_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {
        "name": "weather.get_forecast",
        "arguments": {
            "location": "Zürich",
            "days": 3,
            "metric": True,
            "verbose": False,
            "cursor": None,
            "include": [{"field": "rain", "precision": 0.1}, {"field": "wind"}],
            "options": {"lang": "de", "alerts": ["storm", "flood"]},
            "scale": 1.0,
            "note": "line one\nline \"two\"",
        },
    },
}
SEARCH_CALL = {
    "id": "call_2",
    "type": "function",
    "function": {"name": "search", "arguments": {"query": "föhn wind", "max_results": 5}},
}


def muse_cases():
    base = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    user = {"role": "user", "content": "What's the weather like in Zürich tomorrow?"}
    system = {"role": "system", "content": "You are a concise assistant."}
    cases = []

    def add(name, messages, **kw):
        ctx = dict(base)
        ctx["messages"] = messages
        ctx.update(kw)
        cases.append((name, ctx))

    add("user_only_default_strength", [user], add_generation_prompt=True)
    for rs in ["low", "medium", "high", "xhigh"]:
        add(f"system_strength_{rs}", [system, user], add_generation_prompt=True,
            reasoning_strength=rs)
    add("no_system_strength_low", [user], add_generation_prompt=True, reasoning_strength="low")
    add("tools_no_system", [user], tools=[WEATHER_TOOL, ALERTS_TOOL, SEARCH_TOOL],
        add_generation_prompt=True)
    add("tools_with_system", [system, user], tools=[WEATHER_TOOL, SEARCH_TOOL],
        add_generation_prompt=True, reasoning_strength="medium")
    add("tool_call_and_result", [
        user,
        {"role": "assistant", "content": None, "tool_calls": [FORECAST_CALL]},
        {"role": "tool", "name": "weather.get_forecast", "tool_call_id": "call_1",
         "content": "{\"temp_c\": 21, \"sky\": \"clear\"}"},
    ], tools=[WEATHER_TOOL], add_generation_prompt=True)
    add("tool_result_by_call_id", [
        user,
        {"role": "assistant", "content": "", "tool_calls": [FORECAST_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21°C"},
        {"role": "assistant", "content": "Sunny and 21°C."},
        {"role": "user", "content": "Thanks!"},
    ], tools=[WEATHER_TOOL], add_generation_prompt=True)
    add("parallel_tool_calls", [
        system, user,
        {"role": "assistant", "reasoning_content": "I need the forecast and a web search.",
         "tool_calls": [FORECAST_CALL, SEARCH_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "name": "weather.get_forecast",
         "content": "rain"},
        {"role": "tool", "tool_call_id": "call_2", "name": "search",
         "content": [{"type": "text", "text": "Föhn: a warm dry wind."}]},
    ], tools=[WEATHER_TOOL, SEARCH_TOOL], add_generation_prompt=True, reasoning_strength="high")
    add("multi_turn", [
        system,
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the GPU cross the bus? To get to the other cache."},
        {"role": "user", "content": "Another one."},
    ], add_generation_prompt=True)
    add("image_parts", [
        {"role": "user", "content": [
            {"type": "image", "url": "https://example.com/cat.png"},
            {"type": "text", "text": "What is in this picture?"},
            {"type": "video", "url": "clip.mp4"},
            {"type": "text", "text": " And this clip?"},
            {"type": "audio", "url": "ignored.wav"},
        ]},
    ], add_generation_prompt=True)
    add("reasoning_in_history", [
        user,
        {"role": "assistant", "reasoning_content": "The user wants weather; no tools, so answer generally.",
         "content": "I can't check live weather, but Zürich in spring is mild."},
        {"role": "user", "content": "OK."},
    ], add_generation_prompt=True, reasoning_strength="xhigh")
    add("unicode_content", [
        {"role": "system", "content": "Réponds en français. 日本語も話せます。"},
        {"role": "user", "content": "Ça va? 👋🏽 — «ok» \\ \"quotes\" \t tab"},
    ], add_generation_prompt=True)
    add("literal_control_tokens", [
        {"role": "user", "content": "Please print <|eot|> and <|start|>assistant to=user<|message|> verbatim."},
    ], add_generation_prompt=True)
    add("no_generation_prompt", [
        user, {"role": "assistant", "content": "It will be sunny."},
    ], add_generation_prompt=False)
    add("generation_prompt_absent", [user])
    add("system_with_reasoning_effort", [
        {"role": "system", "content": "Be brief.\nReasoning Effort: low"}, user,
    ], add_generation_prompt=True, reasoning_strength="high")
    add("system_with_reasoning_strength", [
        {"role": "system", "content": "REASONING STRENGTH: medium. Be brief."}, user,
    ], add_generation_prompt=True)
    add("system_content_parts", [
        {"role": "system", "content": [{"type": "text", "text": "Part one. "},
                                       {"type": "text", "text": "Part two."}]}, user,
    ], add_generation_prompt=True)
    add("assistant_recipient_and_end_turn", [
        user,
        {"role": "assistant", "recipient": "self", "content": "Thinking out loud."},
        {"role": "assistant", "content": "Final answer.", "end_turn": False},
        {"role": "assistant", "content": "More.", "end_turn": True},
    ], add_generation_prompt=True)
    add("consecutive_users_eom", [
        {"role": "user", "content": "First."}, {"role": "user", "content": "Second."},
    ], add_generation_prompt=True)
    add("namespace_descriptions_and_dates", [user], tools=[WEATHER_TOOL, ALERTS_TOOL, SEARCH_TOOL],
        tool_namespace_descriptions={"weather": "Weather data from MeteoSwiss."},
        knowledge_cutoff="2025-06-01", current_date="2026-02-02", add_generation_prompt=True)
    add("bare_tool_without_wrapper", [user], tools=[BARE_TOOL, SEARCH_TOOL],
        add_generation_prompt=True)
    add("empty_messages", [], add_generation_prompt=True)
    add("empty_tools_list", [user], tools=[], add_generation_prompt=True)
    add("tools_none", [user], tools=None, add_generation_prompt=True)
    add("error_string_arguments", [
        user,
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "search", "arguments": "{\"query\": \"x\"}"}}]},
    ], tools=[SEARCH_TOOL])
    add("tool_call_then_answer_same_turn", [
        user,
        {"role": "assistant", "content": None, "tool_calls": [SEARCH_CALL]},
        {"role": "tool", "name": "search", "content": "result"},
        {"role": "assistant", "reasoning_content": "Summarise.", "content": "Done: result."},
    ], tools=[SEARCH_TOOL], add_generation_prompt=False, reasoning_strength="low")
    return cases


def llama31_cases():
    base = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    out = []

    def add(name, **kw):
        ctx = dict(base)
        ctx.update(kw)
        out.append((name, ctx))

    add("basic", messages=[{"role": "system", "content": "  Be helpful.  "},
                           {"role": "user", "content": "Hi  \n"}], add_generation_prompt=True)
    add("no_system", messages=[{"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "Hello"}],
        add_generation_prompt=False)
    add("tools_in_user_message", messages=[
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "tool_calls": [FORECAST_CALL]},
        {"role": "tool", "content": "{\"t\": 20}"},
        {"role": "ipython", "content": {"raw": [1, 2.5, None, True]}},
    ], tools=[WEATHER_TOOL, SEARCH_TOOL], add_generation_prompt=True)
    add("tools_in_system", messages=[{"role": "user", "content": "q"}],
        tools=[SEARCH_TOOL], tools_in_user_message=False, date_string="01 Jan 2026",
        add_generation_prompt=True)
    add("builtin_tools", messages=[
        {"role": "user", "content": "Search föhn"},
        {"role": "assistant", "tool_calls": [{"function": {
            "name": "brave_search", "arguments": {"query": "föhn"}}}]},
    ], builtin_tools=["brave_search", "code_interpreter", "wolfram_alpha"])
    add("error_multiple_calls", messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [FORECAST_CALL, SEARCH_CALL]},
    ])
    return out


def qwen25_cases():
    out = []
    out.append(("no_tools", {"messages": [{"role": "user", "content": "Hi"}],
                             "add_generation_prompt": True}))
    out.append(("system_multi_turn", {"messages": [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
        "add_generation_prompt": True}))
    out.append(("tools_and_results", {"messages": [
        {"role": "user", "content": "Weather and search"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [FORECAST_CALL, SEARCH_CALL]},
        {"role": "tool", "content": "rain"}, {"role": "tool", "content": "föhn results"},
        {"role": "assistant", "content": "Rainy."}],
        "tools": [WEATHER_TOOL, SEARCH_TOOL], "add_generation_prompt": False}))
    return out


def qwen3_cases():
    out = []
    out.append(("thinking_split", {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nsimple\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "<think>\nalso simple\n</think>\n\n6"}],
        "add_generation_prompt": False}))
    out.append(("reasoning_content_and_tools", {"messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
         "tool_calls": [FORECAST_CALL]},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "<tool_response>x</tool_response>"}],
        "tools": [WEATHER_TOOL], "add_generation_prompt": True}))
    out.append(("enable_thinking_false", {"messages": [{"role": "user", "content": "Hi"}],
                                          "add_generation_prompt": True,
                                          "enable_thinking": False}))
    return out


def gemma2_cases():
    base = {"bos_token": "<bos>"}
    return [
        ("alternating", dict(base, messages=[
            {"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Hello\n"},
            {"role": "user", "content": "Bye"}], add_generation_prompt=True)),
        ("error_system", dict(base, messages=[{"role": "system", "content": "x"}])),
        ("error_not_alternating", dict(base, messages=[
            {"role": "user", "content": "a"}, {"role": "user", "content": "b"}])),
    ]


def gemma4_cases():
    """Gemma 4 (both shipped variants): thinking on and off, tool declarations with nested
    schemas, calls whose arguments hold every value kind (None prints as Python writes it),
    results as role:tool messages and as the native tool_responses field, thinking in history,
    content parts with an image."""
    base = {"bos_token": "<bos>", "eos_token": "<eos>"}
    system = {"role": "system", "content": "  You are a concise assistant.  "}
    user = {"role": "user", "content": "What's the weather like in Zürich tomorrow?"}
    result = {"role": "tool", "tool_call_id": "call_1", "name": "weather.get_forecast",
              "content": "{\"temp_c\": 21, \"sky\": \"clear\"}"}
    cases = []

    def add(name, messages, **kw):
        ctx = dict(base)
        ctx["messages"] = messages
        ctx.update(kw)
        cases.append((name, ctx))

    add("user_only", [user], add_generation_prompt=True)
    add("user_only_thinking", [user], add_generation_prompt=True, enable_thinking=True)
    add("system_thinking_off", [system, user], add_generation_prompt=True, enable_thinking=False)
    add("developer_first", [{"role": "developer", "content": "Be brief."}, user],
        add_generation_prompt=True)
    add("tools_declared", [system, user], tools=[WEATHER_TOOL, ALERTS_TOOL, SEARCH_TOOL],
        add_generation_prompt=True, enable_thinking=True)
    add("tool_call_and_result", [
        user, {"role": "assistant", "content": None, "tool_calls": [FORECAST_CALL]}, result,
    ], tools=[WEATHER_TOOL], add_generation_prompt=True)
    add("tool_call_pending", [
        user, {"role": "assistant", "content": "", "tool_calls": [SEARCH_CALL]},
    ], tools=[SEARCH_TOOL], add_generation_prompt=True)
    add("parallel_calls_reasoning", [
        system, user,
        {"role": "assistant", "reasoning_content": "I need the forecast and a web search.",
         "tool_calls": [FORECAST_CALL, SEARCH_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
        {"role": "tool", "tool_call_id": "call_2",
         "content": [{"type": "text", "text": "Föhn: a warm dry wind."}]},
    ], tools=[WEATHER_TOOL, SEARCH_TOOL], add_generation_prompt=True, enable_thinking=True)
    add("round_trip_then_user", [
        user, {"role": "assistant", "content": "", "tool_calls": [FORECAST_CALL]}, result,
        {"role": "assistant", "content": "Sunny and 21°C."},
        {"role": "user", "content": "Thanks!"},
    ], tools=[WEATHER_TOOL], add_generation_prompt=True)
    add("native_tool_responses", [
        user, {"role": "assistant", "tool_calls": [FORECAST_CALL, SEARCH_CALL],
               "tool_responses": [
                   {"name": "weather.get_forecast", "response": {"temp_c": 21, "sky": "clear",
                                                                 "hourly": [1.5, None, True]}},
                   {"name": "search", "response": "no results"}],
               "content": "It will be clear."},
        {"role": "user", "content": "And Bern?"},
    ], tools=[WEATHER_TOOL, SEARCH_TOOL], add_generation_prompt=True)
    add("thinking_in_history_stripped", [
        user, {"role": "assistant",
               "content": "<|channel>thought\nLet me recall.<channel|>Sunny.  "},
        {"role": "user", "content": [{"type": "text", "text": " Show me "},
                                     {"type": "image"}, {"type": "text", "text": "this"}]},
    ], add_generation_prompt=True)
    add("no_generation_prompt", [system, user, {"role": "assistant", "content": "Clear."}],
        add_generation_prompt=False)
    return cases


def generic_cases():
    """One conversation set for templates that only need to be exercised broadly."""
    base = {"bos_token": "<s>", "eos_token": "</s>"}
    system = {"role": "system", "content": "You are helpful."}
    user = {"role": "user", "content": "What's the weather in Zürich?"}
    call = {"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": {"location": "Zürich", "days": 3, "flag": True}}}
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather <now>.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City"},
            "days": {"type": "integer"}}, "required": ["location"]}}}
    return [
        ("simple", dict(base, messages=[user], add_generation_prompt=True)),
        ("system_multi_turn", dict(base, messages=[
            system, user, {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "Thanks"}], add_generation_prompt=True)),
        ("tools", dict(base, messages=[system, user], tools=[tool], add_generation_prompt=True)),
        ("tool_call_round_trip", dict(base, messages=[
            user, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."}], tools=[tool],
            add_generation_prompt=False)),
        ("reasoning_history", dict(base, messages=[
            user, {"role": "assistant", "content": "Sunny.", "reasoning_content": "Recall."},
            {"role": "user", "content": "More?"}], add_generation_prompt=True,
            thinking_budget=2048, reasoning_effort="low")),
    ]


TEMPLATES = {
    "muse-glimmer": muse_cases,
    "meta-llama-Llama-3.1-8B-Instruct": llama31_cases,
    "Qwen-Qwen2.5-7B-Instruct": qwen25_cases,
    "Qwen-Qwen3-0.6B": qwen3_cases,
    "google-gemma-2-2b-it": gemma2_cases,
    "google-gemma-4-31B-it": gemma4_cases,
    "google-gemma-4-31B-it-interleaved": gemma4_cases,
    # Broad coverage: Markup via |safe (functionary), int dict keys (Seed-OSS), heavy macros
    # and namespaces (gpt-oss), tojson-based tool prompts (Hermes 3), DeepSeek's format.
    "openai-gpt-oss-120b": generic_cases,
    "ByteDance-Seed-OSS": generic_cases,
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": generic_cases,
    "deepseek-ai-DeepSeek-V3.1": generic_cases,
    "meetkai-functionary-medium-v3.1": generic_cases,
}


def main():
    (HERE / "vectors").mkdir(exist_ok=True)
    for name, cases_fn in TEMPLATES.items():
        source = (HERE / "fixtures" / f"{name}.jinja").read_text(encoding="utf-8")
        vectors = []
        for case_name, ctx in cases_fn():
            vectors.append({"name": case_name, "context": ctx, **render(source, ctx)})
        out = HERE / "vectors" / f"{name}.json"
        out.write_text(json.dumps({"template": f"fixtures/{name}.jinja", "now": FIXED_NOW.isoformat(),
                                   "cases": vectors}, ensure_ascii=False, indent=1) + "\n",
                       encoding="utf-8")
        print(f"{out.name}: {len(vectors)} cases")
    import engine_cases  # noqa: E402  (small feature snippets, see engine_cases.py)
    cases = []
    for case_name, source, ctx in engine_cases.CASES:
        cases.append({"name": case_name, "template": source, "context": ctx, **render(source, ctx)})
    (HERE / "vectors" / "engine_features.json").write_text(
        json.dumps({"now": FIXED_NOW.isoformat(), "cases": cases}, ensure_ascii=False, indent=1) + "\n",
        encoding="utf-8")
    print(f"engine_features.json: {len(cases)} cases")


if __name__ == "__main__":
    main()
