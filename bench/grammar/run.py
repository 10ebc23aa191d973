#!/usr/bin/env python3
"""The structured-output benchmark (issue 16): offgraph's grammar masks against llama.cpp's grammar
sampler on the same JSON Schemas and tokens, and decode tokens/s with and without a constraint.

    python3 bench/grammar/run.py                  # everything; writes docs/structured-output-bench.md
    python3 bench/grammar/run.py --quick          # one request per schema, fewer decode reps
    python3 bench/grammar/run.py --skip-decode    # masks only
    python3 bench/grammar/run.py --report-only RESULTS.json   # rewrite the page from saved results

It builds nothing: `make bench-grammar` builds grammar_bench, llama_grammar_bench and offgraph in
build-bench/ (--build-dir) and then runs this. Python 3 standard library only.

Masks (bench/grammar/grammar_bench.cpp, bench/grammar/llama_grammar_bench.cpp): for each schema in
bench/grammar/schemas/ (NAME.schema.json, NAME.instance.json: a valid instance, compact, properties
in schema order), the instance is tokenized by the vocabulary's own tokenizer and walked token by
token; each step times the full mask over the vocabulary (offgraph: GrammarMatcher::fill_mask;
llama.cpp: llama_sampler_apply of its grammar sampler on every token id) and the accept
(accept_token; llama_sampler_accept). offgraph walks three requests per schema: cold (a vocabulary
that holds no table: no warm-up), first (a vocabulary warmed as `offgraph serve` warms its own at
startup), both paying the compilation (json_schema_grammar + compile_grammar), and cached (the
compiled grammar again, as the server's cache keeps it). llama.cpp walks two: the first pays
json_schema_to_grammar + llama_sampler_init_grammar, the second does it again (llama-server keeps
no compiled grammar); both of offgraph's first requests are set against its first. The two sides run one after the other, never at
once.

Vocabularies: llama-bpe (128,256 tokens, the pinned tree's models/ggml-vocab-llama-bpe.gguf, which
the generated Muse Glimmer bench models carry too). The real Muse Glimmer vocabulary (202,048
tokens, Llama 4's) is not on this machine (the pinned tree ships no llama4 vocabulary); the
largest real vocabulary here, gemma-4's (262,144 tokens, models/ggml-vocab-gemma-4.gguf), stands in
for the 200K class. offgraph has no tokenizer for it, so both sides walk llama.cpp's tokens of it.

Decode: `offgraph serve` on the generated Muse Glimmer 0.4b q8_0 model, greedy /v1/completions of
--decode-tokens tokens, streamed: free, under a cached response_format json_schema (free strings,
so that generation runs long), and under a schema the server has not seen (it compiles the grammar
and its tables during the request), rotated rep by rep. Decode tokens/s = (tokens - 1) / (last
token's arrival - first token's); "slower" is free tok/s / constrained tok/s - 1.
"""
import argparse
import hashlib
import http.client
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CACHE = Path(os.environ.get("OFFGRAPH_CACHE",
                            Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "offgraph"))
DOC = ROOT / "docs" / "structured-output-bench.md"
KEEP_MARKER = "<!-- kept: hand-written notes below survive a rerun of bench/grammar/run.py -->"
T0 = time.time()

DECODE_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "summary": {"type": "string"},
                   "body": {"type": "string"}},
    "required": ["title", "summary", "body"],
    "additionalProperties": False,
}
DECODE_PROMPT = "Write a short note about the weather in Lisbon, as JSON with a title, a summary and a body."


def log(msg):
    el = time.time() - T0
    print(f"[bench-grammar {int(el // 60):02d}:{int(el % 60):02d}] {msg}", file=sys.stderr, flush=True)


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def source_hashes():
    """Which matcher the numbers are of: the grammar sources are not always committed when this runs."""
    out = {}
    for p in sorted((ROOT / "src" / "sample").glob("*.cpp")) + sorted((ROOT / "src" / "sample").glob("*.h")):
        if p.name.startswith(("grammar", "json_schema", "gbnf")):
            out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
    try:
        out["git HEAD"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                         text=True).stdout.strip()
    except OSError:
        pass
    return out


def cmake_cache(build_dir, key):
    path = build_dir / "CMakeCache.txt"
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith(key + ":"):
                return line.split("=", 1)[1]
    return None


def run_jsonl(cmd, out_path):
    log(" ".join(map(str, cmd)))
    t = time.time()
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    out_path.write_text(p.stdout)
    if p.returncode not in (0, 1) or not p.stdout.strip():
        raise RuntimeError(f"{cmd[0]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    if p.stderr.strip():
        log(p.stderr.strip()[-2000:])
    log(f"  {time.time() - t:.0f} s")
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


# ---------------------------------------------------------------------------------------------
# Masks


def mask_section(args, bins, tree, work):
    schemas = HERE / "schemas"
    vocabs = [("128K", "llama-bpe", Path(tree) / "models" / "ggml-vocab-llama-bpe.gguf"),
              ("262K (200K stand-in)", "gemma-4", Path(tree) / "models" / "ggml-vocab-gemma-4.gguf")]
    requests = "1" if args.quick else "2"
    results = []
    for label, short, path in vocabs:
        if not path.exists():
            log(f"no {path}: skipped")
            continue
        only = ["--only", args.only] if args.only else []
        llama_out = work / f"llama-{short}.jsonl"
        ll = run_jsonl([bins["llama"], "--vocab", path, "--schemas", schemas, "--requests", requests,
                        "--steps", *only], llama_out)
        cmd = [bins["ours"], "--vocab", path, "--schemas", schemas, "--requests", requests, "--steps", *only]
        og = run_jsonl(cmd, work / f"offgraph-{short}.jsonl")
        commands = [" ".join(map(short_path, [bins["llama"], "--vocab", path, "--schemas", schemas, "--requests",
                                              requests, "--steps", *only])),
                    " ".join(map(short_path, cmd))]
        results.append(dict(label=label, vocab=short, path=str(path), llama=ll, offgraph=og, commands=commands))
    return results


# ---------------------------------------------------------------------------------------------
# Decode


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(port, method, path, body=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"} if body is not None else {})
    r = c.getresponse()
    return r.status, r.read()


def cpu_seconds(pid):
    """utime + stime of a process (all its threads), from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decode_schema(variant=None):
    """DECODE_SCHEMA, or a copy whose first property is renamed (a grammar the server has not seen)."""
    if variant is None:
        return DECODE_SCHEMA
    props = dict(DECODE_SCHEMA["properties"])
    first = next(iter(props))
    renamed = {f"{first}_{variant}": props.pop(first), **props}
    return {**DECODE_SCHEMA, "properties": renamed, "required": list(renamed)}


def completion(port, tokens, schema, pid=None):
    constrained = schema is not None
    body = {"prompt": DECODE_PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "note", "schema": schema}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    cpu0 = cpu_seconds(pid) if pid else None
    t0 = time.time()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"/v1/completions: HTTP {r.status}: {r.read()[:500]!r}")
    times, text, usage, finish = [], "", None, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        j = json.loads(data)
        if j.get("usage"):
            usage = j["usage"]
        for ch in j.get("choices", []):
            if ch.get("text"):
                times.append(time.time())
                text += ch["text"]
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    cpu = cpu_seconds(pid) - cpu0 if pid else None
    n = usage["completion_tokens"] if usage else len(times)
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    return dict(constrained=constrained, tokens=n, chunks=len(times), ttft=times[0] - t0 if times else None,
                wall=time.time() - t0, decode_tps=(n - 1) / span if span == span and span > 0 else None,
                finish=finish, text=text, cpu_ms_per_token=1000 * cpu / n if cpu is not None and n else None)


def decode_section(args, bins):
    model = Path(args.model)
    if not model.exists():
        raise RuntimeError(f"no {model}: bench/run generates it (offgraph synth --preset 0.4b --type q8_0)")
    port = free_port()
    cmd = [str(bins["offgraph"]), "serve", "-m", str(model), "--port", str(port), "-t", str(args.threads),
           "--parallel", "1", "-c", "4096"]
    log(" ".join(cmd))
    log_path = Path(args.work) / "offgraph-serve.log"
    server = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                status, data = http_json(port, "GET", "/health", timeout=5)
                if status == 200 and json.loads(data).get("status") == "ok":
                    break
            except (OSError, ValueError):
                pass
            if server.poll() is not None:
                raise RuntimeError(f"offgraph serve exited: {log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        else:
            raise RuntimeError("offgraph serve did not become healthy")
        log("warm-up: 8 tokens free, then 8 under the schema (the prompt and that grammar are then cached)")
        completion(port, 8, None, server.pid)
        completion(port, 8, decode_schema(), server.pid)
        runs = []
        reps = 1 if args.quick else args.decode_reps
        modes = ["free", "cached", "new"]
        for r in range(reps):
            order = modes[r % 3:] + modes[:r % 3]
            for mode in order:
                schema = None if mode == "free" else decode_schema(None if mode == "cached" else f"r{r + 1}")
                x = completion(port, args.decode_tokens, schema, server.pid)
                x["rep"], x["mode"] = r + 1, mode
                x["load"] = loadavg()
                log(f"  rep {r + 1} {mode:6s} {x['tokens']} tokens, {x['decode_tps']:.2f} tok/s, "
                    f"{x['cpu_ms_per_token']:.1f} CPU ms/token, ttft {x['ttft']:.3f} s, finish {x['finish']}, "
                    f"load {x['load']}")
                runs.append(x)
        return dict(command=" ".join(map(short_path, cmd)), model=str(model), tokens=args.decode_tokens, runs=runs,
                    schema=DECODE_SCHEMA, prompt=DECODE_PROMPT)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


# ---------------------------------------------------------------------------------------------
# Report


def f1(x):
    return "-" if x is None else f"{x:,.1f}"


def fus(x):
    """Microseconds, 3 significant-ish digits."""
    if x is None:
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def ftps(x):
    return "-" if not x else f"{x:.2f}"


def fdur(us):
    return f"{us / 1000:,.0f} ms" if us >= 1000 else f"{us:.0f} µs"


def short_path(x):
    return str(x).replace(str(ROOT) + "/", "").replace(str(Path.home()), "~")


def fms(us):
    return "-" if us is None else f"{us / 1000:.2f}"


def by_schema(rows):
    return {r["schema"]: r for r in rows}


def buckets(steps):
    edges = [(0, 5, "≤ 5 µs"), (5, 50, "5-50 µs"), (50, 1000, "50 µs-1 ms"), (1000, 100000, "1-100 ms"),
             (100000, float("inf"), "> 100 ms")]
    out = []
    total = sum(steps) or 1
    for lo, hi, name in edges:
        sel = [s for s in steps if lo < s <= hi or (lo == 0 and s <= hi)]
        out.append((name, len(sel), sum(sel) / total))
    return out


def decode_summary(decode):
    runs = decode["runs"]
    mode = lambda r: r.get("mode", "cached" if r["constrained"] else "free")
    by = {m: [r for r in runs if mode(r) == m and r["decode_tps"]] for m in ("free", "cached", "new")}
    if not by["free"] or not by["cached"]:
        return None
    med = lambda rs, k: statistics.median([r[k] for r in rs if r.get(k)]) if any(r.get(k) for r in rs) else float("nan")
    out = dict(n=len({r["rep"] for r in runs}))
    for m in ("free", "cached", "new"):
        out[m] = med(by[m], "decode_tps") if by[m] else float("nan")
        out["cpu_" + m] = med(by[m], "cpu_ms_per_token") if by[m] else float("nan")
    for m in ("cached", "new"):
        out[m + "_pct"] = 100 * (out["free"] / out[m] - 1) if out[m] == out[m] else float("nan")
        out["cpu_" + m + "_pct"] = 100 * (out["cpu_" + m] / out["cpu_free"] - 1)
        pairs = []
        for f in by["free"]:
            c = [r for r in by[m] if r["rep"] == f["rep"]]
            if c:
                pairs.append(f["decode_tps"] / c[0]["decode_tps"] - 1)
        out[m + "_pair_pct"] = 100 * statistics.median(pairs) if pairs else float("nan")
    return out


def request_of(row, k):
    reqs = row.get("requests", [])
    return reqs[k] if len(reqs) > k else None


# (offgraph request index, llama.cpp request index, title): grammar_bench walks cold, then first
# on a warmed vocabulary, then cached; llama_grammar_bench has a first and a second request.
REQUEST_KINDS = [
    (0, 0, "cold first request (no warm-up: a vocabulary that holds no table yet; offgraph compiles the grammar)"),
    (1, 0, "first request on a warmed server (compiles the grammar; the tables of rules the startup warm-up "
           "shares are reused, exactly or sorted again)"),
    (2, 1, "cached (offgraph reuses the compiled grammar; llama.cpp parses again)"),
]


def mask_tables(res):
    lines = []
    ours, theirs = by_schema(res["offgraph"]), by_schema(res["llama"])
    names = sorted(set(ours) | set(theirs))
    problems = []
    for k, kl, title in REQUEST_KINDS:
        if not any(request_of(r, k) for r in res["offgraph"]):
            continue
        lines += [f"**{res['label']} ({res['vocab']}), {title}.** Mask µs per token over the whole vocabulary "
                  "(mean / median / p99 / max); setup ms = what the request pays before its first mask (offgraph: "
                  "json_schema_grammar + compile_grammar, its position tables then computed inside the first masks "
                  "that need them; llama.cpp: json_schema_to_grammar + llama_sampler_init_grammar).", "",
                  "| schema | tokens | offgraph setup ms | llama.cpp setup ms | offgraph mask µs | llama.cpp mask µs "
                  "| ratio mean | ratio median | offgraph accept µs | llama.cpp accept µs |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for n in names:
            o, t = ours.get(n, {}), theirs.get(n, {})
            ro, rt = request_of(o, k), request_of(t, kl)
            if ro is None or rt is None:
                lines.append(f"| {n} | - | {o.get('error', '')} | {t.get('error', '')} | | | | | | |")
                continue
            o_setup = (o["schema_to_grammar_us"] + o["compile_us"]) if k < 2 else 0.0
            t_setup = rt["schema_to_grammar_us"] + rt["init_us"]
            mo, mt = ro["mask_us"], rt["mask_us"]
            ratio_mean = mt["mean"] / mo["mean"] if mo.get("mean") else None
            ratio_med = mt["median"] / mo["median"] if mo.get("median") else None
            for side, rr in (("offgraph", ro), ("llama.cpp", rt)):
                if rr.get("error"):
                    problems.append(f"{res['vocab']} {n} request {k + 1}, {side}: {rr['error']}")
            lines.append(
                f"| {n} | {o.get('tokens', '-')} | {fms(o_setup) if k < 2 else '0 (cached)'} | {fms(t_setup)} | "
                f"{fus(mo['mean'])} / {fus(mo['median'])} / {fus(mo['p99'])} / {fus(mo['max'])} | "
                f"{fus(mt['mean'])} / {fus(mt['median'])} / {fus(mt['p99'])} / {fus(mt['max'])} | "
                f"{'-' if ratio_mean is None else f'{ratio_mean:,.1f}x'} | "
                f"{'-' if ratio_med is None else f'{ratio_med:,.0f}x'} | "
                f"{fus(ro['accept_us']['mean'])} | {fus(rt['accept_us']['mean'])} |")
        lines.append("")
    return lines, problems


def write_report(results, path):
    masks, decode, meta = results["masks"], results.get("decode"), results["meta"]
    L = ["# Structured output: grammar masks and constrained decode (issue 16)", "",
         f"Written by `bench/grammar/run.py` ({meta['date']}; `make bench-grammar` builds the binaries and runs it). "
         f"Machine: {meta['nproc']} cores, {meta['cpu']}; load average {meta['load_start']} at the start, "
         f"{meta['load_end']} at the end (the machine is shared: other engineers' builds and tests run beside "
         "this, so single slow steps can be preemption).", "",
         "Sources measured (sha256 prefixes; the grammar code may be uncommitted when this runs): "
         + ", ".join(f"{k} `{v}`" for k, v in meta.get("sources", {}).items()) + ".", "",
         "Targets (issue 16): mask ≤ 50 µs per token (XGrammar / llguidance level), ≥ 10x faster than llama.cpp's "
         "grammar sampler, decode slowed ≤ 5%, compile time reported.", ""]

    # Headline.
    L += ["## Summary", ""]
    for res in masks:
        ours, theirs = by_schema(res["offgraph"]), by_schema(res["llama"])
        for k, kl, what in ((0, 0, "cold first request (no warm-up)"), (1, 0, "first request on a warmed server"),
                            (2, 1, "compiled grammar cached")):
            cells = []
            for n in sorted(ours):
                ro, rt = request_of(ours[n], k), request_of(theirs.get(n, {}), kl)
                if ro and rt and ro["mask_us"].get("mean"):
                    cells.append(f"{n} {fus(ro['mask_us']['mean'])} µs vs {fus(rt['mask_us']['mean'])} µs "
                                 f"({rt['mask_us']['mean'] / ro['mask_us']['mean']:,.0f}x)")
            if cells:
                L.append(f"- {res['label']} ({res['vocab']}), mean mask per token, offgraph vs llama.cpp, {what}: "
                         + "; ".join(cells) + ".")
    if decode:
        d = decode_summary(decode)
        if d:
            L.append(f"- Decode ({decode['tokens']} tokens, greedy): {d['free']:.2f} tok/s free, {d['cached']:.2f} under a "
                     f"cached JSON Schema grammar ({d['cached_pct']:+.1f}%, pairwise {d['cached_pair_pct']:+.1f}%), "
                     f"{d['new']:.2f} with a schema the server has not seen ({d['new_pct']:+.1f}%, pairwise "
                     f"{d['new_pair_pct']:+.1f}%): medians of {d['n']} reps; target: slowed ≤ 5%.")
    L.append("")

    L += ["## Method", "",
          "Each schema in `bench/grammar/schemas/` comes with a valid instance, compact and with properties in "
          "schema order (offgraph's grammar writes properties in schema order and no whitespace is required by "
          "either grammar). The instance is tokenized with the vocabulary's own tokenizer (offgraph: "
          "`text::Tokenizer::from_gguf` + `encode(no BOS, no specials)`; llama.cpp: `llama_tokenize(add_special = "
          "false, parse_special = false)`), the end-of-generation token appended, and walked: at every step "
          "(a) the full mask over the vocabulary is timed (offgraph: `GrammarMatcher::fill_mask`; llama.cpp: "
          "`llama_sampler_apply` of `llama_sampler_init_grammar(vocab, gbnf, \"root\")` on a "
          "`llama_token_data_array` holding every token id, restored untimed before each step: the path "
          "llama-server takes when it must check all candidates), the instance's token is checked to be allowed, "
          "then (b) the accept is timed (`accept_token`; `llama_sampler_accept`). Setup: offgraph "
          "`json_schema_grammar` + `compile_grammar` (`compile_stats().seconds`); llama.cpp "
          "`json_schema_to_grammar` (common/json-schema-to-grammar.h, GBNF forced) + `llama_sampler_init_grammar`. "
          "p99 is nearest-rank over the steps (with 70-220 steps it is the second or third largest). "
          "The two sides run one after the other; each calls `malloc_trim(0)` (untimed) before every request, so "
          "that glibc's consolidation of the previous request's frees does not land in the next timed "
          "allocation (it showed up as several ms in offgraph's compile time when a schema followed a "
          "long walk). Within a request nothing is trimmed: that cost stays where it falls.", "",
          "Note on llama-server: by default its sampler first samples without the grammar and checks only the "
          "sampled token (`common_sampler_sample`), applying the grammar to every candidate only when that token "
          "is rejected; the full-vocabulary figure here is that fallback, the cost a grammar-first sampler pays "
          "every step.", ""]

    L += ["## Vocabularies", "",
          "- 128K: llama-bpe, 128,256 tokens (the pinned tree's `models/ggml-vocab-llama-bpe.gguf`; the generated "
          "Muse Glimmer bench models `~/.cache/offgraph/bench-models/muse-glimmer-0.4b-q8_0*.gguf` carry this same "
          "vocabulary: `offgraph inspect` reports vocab 128256).",
          "- 200K: the real Muse Glimmer vocabulary (202,048 tokens, Llama 4's tiktoken BPE with the `llama4` "
          "pre-tokenizer) is not on this machine: the pinned tree ships no llama4 vocabulary (tests/text/tokenizer/"
          "llama4_test.cpp loads llama-bpe's with `tokenizer.ggml.pre` swapped) and the bench models are "
          "generated with llama-bpe's. The largest real vocabulary here stands in: gemma-4's, 262,144 tokens "
          "(`models/ggml-vocab-gemma-4.gguf`, a SentencePiece-style BPE), loaded vocab-only by both sides; each "
          "side walks its own tokenizer's ids for the instance (identical: tests/peer/tokenizer_peer_test.cpp).", ""]

    L += ["## Mask time per token", ""]
    problems = []
    for res in masks:
        t, p = mask_tables(res)
        L += t
        problems += p
    # Token sequences and acceptance.
    L += ["### Token sequences and acceptance", ""]
    for res in masks:
        ours, theirs = by_schema(res["offgraph"]), by_schema(res["llama"])
        for n in sorted(set(ours) | set(theirs)):
            o, t = ours.get(n, {}), theirs.get(n, {})
            same = o.get("token_ids") == t.get("token_ids")
            note = "identical token ids" if same else (
                f"token ids DIFFER (offgraph {len(o.get('token_ids', []))}, llama.cpp {len(t.get('token_ids', []))})")
            acc = []
            if o.get("grammar_accepts_instance") is False:
                acc.append("offgraph's grammar_accepts REFUSES the instance")
            if o.get("token_ids_spell_instance") is False:
                acc.append("the token ids do not spell the instance")
            for side, row in (("offgraph", o), ("llama.cpp", t)):
                for r in row.get("requests", []):
                    if r.get("error"):
                        acc.append(f"{side} request {r['request']}: {r['error']}")
                if row.get("error"):
                    acc.append(f"{side}: {row['error']}")
            allowed = ""
            ro, rt = request_of(o, 0), request_of(t, 0)
            if ro and rt:
                allowed = (f"; mean allowed tokens per step {ro['allowed_mean']:,.0f} (offgraph) vs "
                           f"{rt['allowed_mean']:,.0f} (llama.cpp)")
            L.append(f"- {res['vocab']} {n}: {o.get('tokens', '-')} steps, {note}"
                     f"{'' if o.get('tokenized_by', 'offgraph') == 'offgraph' else ' (llama.cpp tokens on both sides)'}; "
                     f"{'; '.join(acc) if acc else 'both grammars accept every token and the end token'}{allowed}.")
    L.append("")

    # Where offgraph's mask time goes, from the per-step times.
    L += ["### Where offgraph's mask time goes (per-step times, cold first request)", "",
          "Steps by their mask time; a step of ≤ 5 µs is a hit in the matcher's per-state mask cache (a copy of "
          "the bitset). Share = part of the schema's total mask time.", "",
          "| vocab | schema | ≤ 5 µs | 5-50 µs | 50 µs-1 ms | 1-100 ms | > 100 ms | slowest 3 steps (time @ step, before token id) |",
          "|---|---|---|---|---|---|---|---|"]
    for res in masks:
        for row in sorted(res["offgraph"], key=lambda r: r["schema"]):
            r = request_of(row, 0)
            if not r or "step_mask_us" not in r:
                continue
            steps = r["step_mask_us"]
            cells = [f"{n} ({100 * share:.0f}%)" for _, n, share in buckets(steps)]
            ids = row.get("token_ids", [])
            slow = sorted(range(len(steps)), key=lambda i: -steps[i])[:3]
            slow_txt = ", ".join(f"{fdur(steps[i])} @{i}" + (f" (id {ids[i]})" if i < len(ids) else " (end)")
                                 for i in sorted(slow))
            L.append(f"| {res['vocab']} | {row['schema']} | " + " | ".join(cells) + f" | {slow_txt} |")
    L.append("")
    L += ["offgraph compilation: `compile_grammar` lays the grammar out; each stack context's table (the "
          "vocabulary trie walked from it: tokens accepted / rejected whatever the stack below, and uncertain ones "
          "that a mask-cache miss walks byte by byte on the real stack) is made the first time a stack stands "
          "there, inside that mask. Tables are shared through the vocabulary by every grammar whose code the "
          "context reaches is the same (sample/README.md): taken as they are, or, made for a wider FOLLOW set, "
          "sorted again from their uncertain tokens only. The cold request's masks include every table it visits; "
          "the first request on a warmed vocabulary (after `warm_json_tables`, what `offgraph serve` runs at "
          "startup: warm-up ms) walks the trie only for the contexts no warm-up grammar shares; the cached "
          "request finds them all made. All tables = `precompute_all` on a fresh compilation and vocabulary: "
          "one-frame tables (nothing known below) for every position, which are not the contexts a matcher asks for: a measure of the walks alone, not what a request pays.", "",
          "| vocab | schema | grammar rules | schema→grammar ms | compile_grammar ms | tables visited "
          "| table ms cold / first | shared / sorted again (first) | trie nodes walked cold / first "
          "| warm-up ms | all tables ms | llama.cpp GBNF bytes |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in masks:
        theirs = by_schema(res["llama"])
        for row in sorted(res["offgraph"], key=lambda r: r["schema"]):
            if "compile_us" not in row:
                continue
            r1, r2 = request_of(row, 0) or {}, request_of(row, 1) or {}
            L.append(f"| {res['vocab']} | {row['schema']} | {row['grammar_rules']} | {fms(row['schema_to_grammar_us'])} | "
                     f"{fms(row['compile_us'])} | {r1.get('tables_computed', '-')} | "
                     f"{fms(r1.get('table_us_so_far'))} / {fms(r2.get('table_us_so_far'))} | "
                     f"{r2.get('tables_shared', '-')} / {r2.get('tables_refined', '-')} | "
                     f"{r1.get('trie_nodes_walked', 0):,} / {r2.get('trie_nodes_walked', 0):,} | "
                     f"{fms(row.get('warm_up_us'))} | {fms(row.get('all_tables_us'))} | "
                     f"{theirs.get(row['schema'], {}).get('gbnf_bytes', '-')} |")
    L.append("")
    if problems:
        L += ["**Problems:**", ""] + [f"- {p}" for p in problems] + [""]

    if decode:
        L += ["## Decode tokens/s with and without a constraint", "",
              f"`{decode['command']}`; greedy `/v1/completions` of {decode['tokens']} tokens, streamed, prompt "
              f"{json.dumps(decode['prompt'])}. Three modes per rep, order rotated: free (no constraint); cached "
              f"(`response_format` json_schema `{json.dumps(decode['schema'], separators=(',', ':'))}`, which a "
              "warm-up request compiled: the server's grammar cache and the compiled grammar's tables are warm); "
              "new (the same schema with its first property renamed per rep, so the server compiles it and its "
              "tables during the request). Constrained output goes through the server's plain-answer grammar: the "
              "whole output is the JSON value. The warm-up also caches the prompt, so every request starts "
              "decoding at once. Decode tok/s = (tokens - 1) / (last token's arrival - first token's); server CPU = "
              "utime + stime of the server process over the request (less sensitive than wall time to the "
              "other load on the machine). The model has random weights (offgraph synth), so what it writes is "
              "noise; under the schema it stays inside the first free string, where almost every token is "
              "allowed.", "",
              "| rep | mode | tokens | finish | time to first token s | decode tok/s | server CPU ms / token "
              "| load average | output starts |",
              "|---|---|---|---|---|---|---|---|---|"]
        for r in decode["runs"]:
            L.append(f"| {r['rep']} | {r.get('mode', 'cached' if r['constrained'] else 'free')} | {r['tokens']} | "
                     f"{r['finish']} | {r['ttft']:.3f} | {ftps(r['decode_tps'])} | {f1(r.get('cpu_ms_per_token'))} | "
                     f"{r.get('load', '-')} | "
                     f"`{json.dumps(r['text'][:60])[1:-1].replace('|', '¦').replace('`', chr(39))}` |")
        d = decode_summary(decode)
        if d:
            L += ["", f"Medians over {d['n']} reps: free {d['free']:.2f} tok/s, cached {d['cached']:.2f} "
                      f"({d['cached_pct']:+.1f}%), new schema {d['new']:.2f} ({d['new_pct']:+.1f}%). Pairwise (each "
                      f"constrained request against the free one of its rep, run within seconds of it): cached "
                      f"{d['cached_pair_pct']:+.1f}%, new {d['new_pair_pct']:+.1f}%. Server CPU per token: free "
                      f"{d['cpu_free']:.1f} ms, cached {d['cpu_cached']:.1f} ms ({d['cpu_cached_pct']:+.1f}%), new "
                      f"{d['cpu_new']:.1f} ms ({d['cpu_new_pct']:+.1f}%). (+: constrained slower.)"]
        L.append("")

    L += ["## Commands", "", "```"]
    for res in masks:
        L += res["commands"]
    if decode:
        L.append(decode["command"])
    L += ["```", ""]
    old = path.read_text() if path.exists() else ""
    kept = old.split(KEEP_MARKER, 1)[1] if KEEP_MARKER in old else "\n"
    L += [KEEP_MARKER]
    path.write_text("\n".join(L) + kept)
    log(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build-bench")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-masks", action="store_true")
    ap.add_argument("--only", help="schemas, comma-separated")
    ap.add_argument("--model", default=str(CACHE / "bench-models" / "muse-glimmer-0.4b-q8_0.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--decode-reps", type=int, default=5)
    ap.add_argument("--work", default=str(CACHE / "bench-results" / "grammar"))
    ap.add_argument("--out", default=str(DOC))
    ap.add_argument("--report-only", metavar="RESULTS.json")
    args = ap.parse_args()
    if args.report_only:
        write_report(json.loads(Path(args.report_only).read_text()), Path(args.out))
        return
    bdir = (ROOT / args.build_dir) if not Path(args.build_dir).is_absolute() else Path(args.build_dir)
    bins = dict(ours=bdir / "bin" / "grammar_bench", llama=bdir / "bin" / "llama_grammar_bench",
                offgraph=bdir / "bin" / "offgraph")
    need = ([] if args.skip_masks else ["ours", "llama"]) + ([] if args.skip_decode else ["offgraph"])
    missing = [str(bins[k]) for k in need if not bins[k].exists()]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: `make bench-grammar` builds them (cmake --build {args.build_dir} "
                 "--target grammar_bench llama_grammar_bench offgraph)")
    tree = cmake_cache(bdir, "OFFGRAPH_LLAMA_TREE")
    if not tree:
        sys.exit(f"{bdir}/CMakeCache.txt names no OFFGRAPH_LLAMA_TREE (make configure BUILD_DIR={args.build_dir})")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    meta = dict(date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), nproc=os.cpu_count(),
                cpu=cpu_model(), load_start=loadavg(), sources=source_hashes())
    results = dict(meta=meta, masks=[], decode=None)
    if not args.skip_masks:
        results["masks"] = mask_section(args, bins, tree, work)
    if not args.skip_decode:
        results["decode"] = decode_section(args, bins)
    meta["load_end"] = loadavg()
    out_json = work / f"results-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
    out_json.write_text(json.dumps(results))
    log(f"results in {out_json}")
    write_report(results, Path(args.out))


if __name__ == "__main__":
    main()
