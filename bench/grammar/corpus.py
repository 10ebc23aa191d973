#!/usr/bin/env python3
"""Structured output on schemas nobody here wrote (issue 38): the corpus in bench/grammar/corpus/
(the tool schemas Claude Code and Codex send, captured by capture_schemas.py) and the pinned
llama.cpp tree's JSON-schema test cases (tests/test-json-schema-to-grammar.cpp, read from the tree,
not copied), each compiled or refused by name, and walked token by token beside llama.cpp.

    python3 bench/grammar/corpus.py                 # writes the corpus table into
                                                    # docs/structured-output-bench.md
    python3 bench/grammar/corpus.py --list          # the cases and their instances only
    python3 bench/grammar/corpus.py --sample 3      # answers drawn through the masks, each
                                                    # validated with python3-jsonschema (exit 1
                                                    # if one does not validate)

For every schema an instance is generated (seeded; properties in schema order, compact) and
checked with python3-jsonschema; a schema no generated instance validates is reported as such.
Then bench/grammar/grammar_bench (offgraph: cold, first on a warmed vocabulary, cached) and
bench/grammar/llama_grammar_bench (llama.cpp's json_schema_to_grammar and grammar sampler) walk
the instance on the llama-bpe vocabulary (128,256 tokens), as run.py does for the bench schemas.
It builds nothing: `make bench-grammar` builds both in build-bench/ (--build-dir).
"""
import argparse
import json
import random
import re
import re._parser as sre
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import jsonschema

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DOC = ROOT / "docs" / "structured-output-bench.md"
BEGIN, END = "<!-- corpus: begin (bench/grammar/corpus.py) -->", "<!-- corpus: end -->"


# ---------------------------------------------------------------------------------------------
# The cases


def committed_cases():
    cases = []
    for f in sorted((HERE / "corpus").glob("*.json")):
        d = json.loads(f.read_text())
        for s in d["schemas"]:
            cases.append(dict(source=f.stem, name=s["name"], schema=s["schema"]))
    return cases


def llama_cases(tree):
    """test({ STATUS, "name", R\"\"\"(schema)\"\"\", R\"\"\"(grammar)\"\"\" }) in the pinned tree."""
    text = (Path(tree) / "tests" / "test-json-schema-to-grammar.cpp").read_text()
    pat = re.compile(r'test\(\{\s*(SUCCESS|FAILURE),\s*"((?:[^"\\]|\\.)*)",\s*R"""\((.*?)\)"""', re.S)
    cases = []
    for status, name, schema in pat.findall(text):
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError:
            continue  # a case about text that is not JSON at all
        cases.append(dict(source="llama.cpp-tests", name=name, schema=parsed, llama_expects=status))
    return cases


# ---------------------------------------------------------------------------------------------
# Instances


class NoInstance(Exception):
    pass


def sample_regex(pattern, rng):
    out = []

    def emit(tree):
        for op, av in tree:
            name = str(op)
            if name == "LITERAL":
                out.append(chr(av))
            elif name == "ANY":
                out.append(rng.choice("abcxyz"))
            elif name == "IN":
                out.append(pick_class(av))
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                lo, hi, sub = av
                hi = lo + 3 if hi is sre.MAXREPEAT or hi > lo + 3 else hi
                for _ in range(rng.randint(lo, hi)):
                    emit(sub)
            elif name == "SUBPATTERN":
                emit(av[-1])
            elif name == "BRANCH":
                emit(rng.choice(av[1]))
            elif name == "AT":
                pass
            elif name == "CATEGORY":
                out.append(category(av))
            else:
                raise NoInstance(f"regex op {name}")

    def category(c):
        c = str(c)
        if "DIGIT" in c and "NOT" not in c:
            return rng.choice("0123456789")
        if "SPACE" in c and "NOT" not in c:
            return " "
        if "WORD" in c and "NOT" not in c:
            return rng.choice("abcxyz_019")
        return rng.choice("abc")

    def pick_class(items):
        if items and str(items[0][0]) == "NEGATE":
            for ch in "abcxyzABC0123_-":
                if not re.fullmatch("[" + "".join(render(i) for i in items) + "]", ch):
                    return ch
            raise NoInstance("negated class")
        choices = []
        for op, av in items:
            n = str(op)
            if n == "LITERAL":
                choices.append(chr(av))
            elif n == "RANGE":
                choices.append(chr(rng.randint(av[0], min(av[1], av[0] + 25))))
            elif n == "CATEGORY":
                choices.append(category(av))
        if not choices:
            raise NoInstance("empty class")
        return rng.choice(choices)

    def render(item):
        op, av = item
        n = str(op)
        if n == "NEGATE":
            return "^"
        if n == "LITERAL":
            return re.escape(chr(av))
        if n == "RANGE":
            return re.escape(chr(av[0])) + "-" + re.escape(chr(av[1]))
        if n == "CATEGORY":
            return {"CATEGORY_DIGIT": r"\d", "CATEGORY_SPACE": r"\s", "CATEGORY_WORD": r"\w"}.get(str(av), "")
        return ""

    emit(sre.parse(pattern))
    return "".join(out)


WORDS = ["alpha", "beta", "file", "run", "list", "x", "note", "path/to/a.txt", "hello world", "ok"]


def generate(schema, root, rng, depth=0):
    if depth > 12:
        raise NoInstance("too deep")
    if schema is True or schema == {}:
        return rng.choice(["x", 1, True, None])
    if schema is False:
        raise NoInstance("false schema")
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref == "#":
            return generate(root, root, rng, depth + 1)
        if not ref.startswith("#/"):
            raise NoInstance(f"$ref {ref}")
        target = root
        for part in ref[2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        return generate(target, root, rng, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            rest = {k: v for k, v in schema.items() if k != key}
            return generate({**rest, **rng.choice(schema[key])}, root, rng, depth + 1)
    if "allOf" in schema:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if "$ref" in part:
                part = resolve(part["$ref"], root)
            for k, v in part.items():
                if k == "properties":
                    merged.setdefault("properties", {}).update(v)
                elif k == "required":
                    merged["required"] = merged.get("required", []) + v
                else:
                    merged[k] = v
        return generate(merged, root, rng, depth + 1)
    t = schema.get("type")
    if isinstance(t, list):
        t = rng.choice([x for x in t if x != "null"] or t)
    if t is None:
        t = ("object" if "properties" in schema or "additionalProperties" in schema else
             "array" if "items" in schema or "prefixItems" in schema else
             "string" if any(k in schema for k in ("pattern", "minLength", "maxLength", "format")) else
             "number" if any(k in schema for k in ("minimum", "maximum")) else "string")
    if t == "object":
        props = schema.get("properties", {})
        required = schema.get("required", [])
        out = {}
        # Optional properties only after the last required one: offgraph's grammar keeps the
        # schema's order, llama.cpp's puts required properties first; such instances suit both.
        names = list(props)
        last_required = max((names.index(n) for n in required if n in props), default=-1)
        for i, (name, sub) in enumerate(props.items()):
            if name in required or (i > last_required and rng.random() < 0.6):
                out[name] = generate(sub, root, rng, depth + 1)
        for name in required:
            if name not in out:
                extra = schema.get("additionalProperties", True)
                out[name] = generate(extra if isinstance(extra, dict) else {}, root, rng, depth + 1)
        return out
    if t == "array":
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", {})
        lo = schema.get("minItems", 0)
        hi = schema.get("maxItems", lo + 3)
        n = rng.randint(max(lo, len(prefix) if items is False else 0), max(lo, min(hi, lo + 3)))
        out = [generate(prefix[i], root, rng, depth + 1) for i in range(min(n, len(prefix)))]
        while len(out) < n:
            out.append(generate(items if isinstance(items, dict) else {}, root, rng, depth + 1))
        return out
    if t == "string":
        if "pattern" in schema:
            return sample_regex(schema["pattern"], rng)
        fmt = schema.get("format")
        if fmt:
            return {"date": "2026-12-07", "time": "12:30:00Z", "date-time": "2026-12-07T12:30:00Z",
                    "uuid": "0b9b2f7c-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "email": "a@example.com",
                    "uri": "https://example.com/a"}.get(fmt, "x")
        lo = schema.get("minLength", 0)
        hi = schema.get("maxLength", max(lo, 24))
        s = rng.choice(WORDS)
        while len(s) < lo:
            s += " " + rng.choice(WORDS)
        return s[:hi] if len(s) > hi else s
    if t in ("integer", "number"):
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -50))
        hi = schema.get("maximum", schema.get("exclusiveMaximum", lo + 1000))
        if "exclusiveMinimum" in schema:
            lo = schema["exclusiveMinimum"] + 1
        if "exclusiveMaximum" in schema:
            hi = schema["exclusiveMaximum"] - 1
        v = rng.randint(int(lo), max(int(lo), int(hi)))
        if "multipleOf" in schema:
            m = schema["multipleOf"]
            v = int(v // m * m) if float(m).is_integer() else v
        return v
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    raise NoInstance(f"type {t}")


def resolve(ref, root):
    target = root
    for part in ref[2:].split("/"):
        target = target[part]
    return target


def instance_for(schema):
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
    except Exception as e:  # noqa: BLE001 - a schema jsonschema cannot read
        return False, f"jsonschema: {e}"[:120]
    why = "no try validated"
    for seed in range(40):
        rng = random.Random(seed)
        try:
            value = generate(schema, schema, rng)
        except (NoInstance, KeyError, TypeError, ValueError, RecursionError, re.error) as e:
            why = f"generator: {e}"[:120]
            continue
        try:
            if validator.is_valid(value):
                return True, value
            why = "the generated instance does not validate"
        except Exception as e:  # noqa: BLE001
            why = f"jsonschema: {e}"[:120]
    return False, why


def slug(case):
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{case['source']}.{case['name']}").strip("-")[:80]


# ---------------------------------------------------------------------------------------------
# Running and the table


def run(cmd):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"{cmd[0]} failed ({p.returncode}): {p.stderr[-2000:]}")
    return {o["schema"]: o for o in (json.loads(l) for l in p.stdout.splitlines() if l.startswith("{"))}


def req(o, kind):
    """offgraph's requests by kind (cold, first, cached); llama.cpp's by number (1: the first)."""
    for r in o.get("requests", []):
        if r.get("kind") == kind or ("kind" not in r and kind == "first" and r.get("request") == 1):
            return r
    return None


def fmt(x, d=1):
    return "" if x is None else f"{x:,.{d}f}"


def table(cases, ours, llama):
    rows, summary = [], dict(compiled=0, refused=0, no_instance=0, walked=0)
    ratios, firsts, worsts = [], [], []
    for c in cases:
        o, l = ours.get(c["slug"]), llama.get(c["slug"])
        if o is None:
            continue
        err = o.get("error", "")
        refused = err.startswith("json_schema_grammar")
        summary["refused" if refused else "compiled"] += not err.startswith("compile_grammar")
        if refused:
            rows.append(f"| {c['source']} | {c['name']} | refused: {err.split(': ', 1)[1][:110]} |"
                        + " |" * 8)
            continue
        if not c["has_instance"]:
            summary["no_instance"] += 1
            rows.append(f"| {c['source']} | {c['name']} | compiled; no instance ({c['why']}) |" + " |" * 8)
            continue
        first, cached, cold = req(o, "first"), req(o, "cached"), req(o, "cold")
        lfirst = req(l, "first") if l else None
        walk_err = next((r.get("error") for r in o.get("requests", []) if r.get("error")), None)
        if walk_err or not first:
            rows.append(f"| {c['source']} | {c['name']} | compiled; walk: {walk_err} |" + " |" * 8)
            continue
        summary["walked"] += 1
        lerr = (l or {}).get("error") or (lfirst or {}).get("error")
        lmean = lfirst["mask_us"]["mean"] if lfirst and not lerr else None
        ratio = lmean / first["mask_us"]["mean"] if lmean else None
        if lerr:
            summary["llama_failed"] = summary.get("llama_failed", 0) + 1
        if ratio:
            ratios.append(ratio)
        firsts.append(first["mask_us"]["mean"])
        worsts.append(first["mask_us"]["max"])
        rows.append(f"| {c['source']} | {c['name']} | compiled | {first['steps']} | {fmt(o.get('compile_us'), 0)} | "
                    f"{fmt(cold['mask_us']['mean'])} | {fmt(first['mask_us']['mean'])} | {fmt(first['mask_us']['max'], 0)} | "
                    f"{fmt(cached['mask_us']['mean']) if cached else ''} | "
                    f"{fmt(lmean) if not lerr else 'fails: ' + lerr[:60]} | {fmt(ratio)}{'x' if ratio else ''} |")
    return rows, summary, ratios, firsts, worsts


def check_samples(cases, bdir, vocab, work, k):
    """Answers drawn through the masks (grammar_bench --sample: uniform over the allowed tokens,
    then favouring ends) must validate against their schema, and each schema's generated valid
    instance must get through the masks; 0 when all do."""
    out = run([bdir / "bin" / "grammar_bench", "--vocab", vocab, "--schemas", work, "--requests", "1",
               "--no-precompute", "--sample", k])
    drawn = finished = bad = 0
    for c in cases:
        o = out.get(c["slug"])
        if not o or "samples" not in o:
            continue
        validator = jsonschema.validators.validator_for(c["schema"])(c["schema"])
        # The other way round: the generated instance, valid by python3-jsonschema, must get
        # through the masks (a token wrongly refused shows here, not in the samples).
        walk_error = next((r["error"] for r in o.get("requests", []) if r.get("error")), None)
        if c["has_instance"] and walk_error:
            bad += 1
            print(f"{c['slug']}: its valid instance is refused: {walk_error}")
        for smp in o["samples"]:
            drawn += 1
            if smp["error"]:
                bad += 1
                print(f"{c['slug']} seed {smp['seed']}: {smp['error']}")
                continue
            if not smp["finished"]:
                continue
            finished += 1
            try:
                value = json.loads(smp["text"])
                errors = [e.message for e in validator.iter_errors(value)]
            except json.JSONDecodeError as e:
                errors = [f"not JSON: {e}"]
            if errors:
                bad += 1
                print(f"{c['slug']} seed {smp['seed']}: {errors[0][:200]}\n  {smp['text'][:300]!r}")
    print(f"{drawn} answers drawn from {sum(1 for c in cases if c['slug'] in out and 'samples' in out[c['slug']])} "
          f"compiled schemas, {finished} finished within the walk's limit, {bad} failed")
    return 1 if bad or finished == 0 else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build-bench")
    ap.add_argument("--tree", help="the pinned llama.cpp tree (default: from the build's CMakeCache)")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "offgraph" / "bench-results" / "corpus"))
    ap.add_argument("--requests", default="2")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--sample", type=int, default=0, metavar="K",
                    help="draw K answers per schema through the masks and validate them, only")
    ap.add_argument("--out", default=str(DOC))
    args = ap.parse_args()
    bdir = Path(args.build_dir) if Path(args.build_dir).is_absolute() else ROOT / args.build_dir
    tree = args.tree
    if not tree:
        cache = (bdir / "CMakeCache.txt").read_text()
        tree = re.search(r"^OFFGRAPH_LLAMA_TREE:[A-Z]+=(.*)$", cache, re.M).group(1)
    cases = committed_cases() + llama_cases(tree)
    work = Path(args.work) / "schemas"
    work.mkdir(parents=True, exist_ok=True)
    for f in work.glob("*.json"):
        f.unlink()
    seen = set()
    for c in cases:
        c["slug"] = slug(c)
        while c["slug"] in seen:
            c["slug"] += "_"
        seen.add(c["slug"])
        c["has_instance"], got = instance_for(c["schema"])
        c["instance"], c["why"] = (got, None) if c["has_instance"] else (None, got)
        (work / f"{c['slug']}.schema.json").write_text(json.dumps(c["schema"]))
        text = json.dumps(c["instance"], separators=(",", ":"), ensure_ascii=False)
        (work / f"{c['slug']}.instance.json").write_text(text + "\n")
    if args.list:
        for c in cases:
            print(c["slug"], "->", json.dumps(c["instance"])[:100] if c["has_instance"] else
                  "NO INSTANCE: " + c["why"])
        return
    vocab = Path(tree) / "models" / "ggml-vocab-llama-bpe.gguf"
    if args.sample:
        sys.exit(check_samples(cases, bdir, vocab, work, args.sample))
    ours_cmd = [bdir / "bin" / "grammar_bench", "--vocab", vocab, "--schemas", work, "--requests",
                args.requests, "--no-precompute"]
    llama_cmd = [bdir / "bin" / "llama_grammar_bench", "--vocab", vocab, "--schemas", work,
                 "--requests", "1"]
    print("running", " ".join(map(str, ours_cmd)), file=sys.stderr)
    ours = run(ours_cmd)
    print("running", " ".join(map(str, llama_cmd)), file=sys.stderr)
    llama = run(llama_cmd)
    rows, s, ratios, firsts, worsts = table(cases, ours, llama)
    total = s["compiled"] + s["refused"]
    lines = [BEGIN, "", "## The corpus: schemas nobody here wrote", "",
             f"Run {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}: `python3 bench/grammar/corpus.py "
             f"--build-dir {args.build_dir}` (grammar_bench --no-precompute --requests {args.requests}, "
             "llama_grammar_bench --requests 1; llama-bpe, 128,256 tokens; mask time per token in µs).", "",
             f"{total} schemas: {s['compiled']} compile, {s['refused']} refused by name "
             f"({100.0 * s['refused'] / max(total, 1):.0f}%); {s['no_instance']} compiled without a generated "
             f"instance that validates; {s['walked']} walked.",
             f"First request (a warmed vocabulary, as `offgraph serve` has), per-schema mean mask time: "
             f"median {statistics.median(firsts) if firsts else 0:.1f} µs, mean {statistics.mean(firsts) if firsts else 0:.1f} µs, "
             f"{sum(1 for x in firsts if x <= 50)} of {len(firsts)} at most 50 µs; worst single mask "
             f"{max(worsts) if worsts else 0:,.0f} µs ({sum(1 for x in worsts if x <= 1000)} of {len(worsts)} at most 1 ms). "
             f"Against llama.cpp's first request on the {len(ratios)} schemas it walks: median {statistics.median(ratios) if ratios else 0:.0f}x, "
             f"least {min(ratios) if ratios else 0:.1f}x ({sum(1 for r in ratios if r >= 10)} at least 10x); "
             f"llama.cpp refuses the instance (a token its own grammar masks out) on {s.get('llama_failed', 0)}.", "",
             "| source | schema | status | tokens | compile µs | cold | first | first worst | cached | llama.cpp first | ratio |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|", *rows, "", END]
    block = "\n".join(lines)
    doc = Path(args.out)
    text = doc.read_text() if doc.exists() else ""
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text)
    print(block)


if __name__ == "__main__":
    main()
