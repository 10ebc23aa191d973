#!/usr/bin/env python3
"""bench/gpu/report.py BENCH.JSONL: the markdown tables of docs/gpu.md from bench/gpu/run.sh's
output (offgraph bench and llama-bench -o jsonl lines side by side, keyed by model file, test,
depth, KV type and CUDA graphs on/off)."""
import json
import os
import sys
from collections import defaultdict


def rows(path):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    pass


def main(path):
    ours, peer, verify, harness = {}, {}, [], []
    for r in rows(path):
        graphs = r.get("cuda_graphs", True)
        if r.get("engine") == "offgraph" and r.get("test") in ("pp", "tg"):
            key = (os.path.basename(r["model"]), r["test"], r["n"], r["depth"], r["ctk"], graphs)
            ours[key] = r["avg_ts"]
        elif r.get("engine") == "offgraph" and r.get("test") == "verify":
            verify.append(r)
        elif r.get("engine") == "harness":
            harness.append(r)
        elif "n_prompt" in r:
            test, n = ("pp", r["n_prompt"]) if r["n_gen"] == 0 else ("tg", r["n_gen"])
            key = (os.path.basename(r["model_filename"]), test, n, r["n_depth"], r["type_k"], graphs)
            peer[key] = r["avg_ts"]
    print("| model | test | depth | KV | CUDA graphs | offgraph t/s | llama.cpp t/s | ratio |")
    print("|---|---|---:|---|---|---:|---:|---:|")
    for key in sorted(set(ours) | set(peer), key=lambda k: (k[0], k[4], not k[5], k[1], k[3])):
        model, test, n, depth, kv, graphs = key
        a, b = ours.get(key), peer.get(key)
        ratio = f"{a / b:.2f}x" if a and b else ""
        fa = f"{a:.1f}" if a else "-"
        fb = f"{b:.1f}" if b else "-"
        print(f"| {model} | {test}{n} | {depth} | {kv} | {'on' if graphs else 'off'} | {fa} | {fb} | {ratio} |")
    if verify:
        print()
        print("| verify k | step (ms) | one-token step (ms) | ratio |")
        print("|---:|---:|---:|---:|")
        for r in verify:
            print(f"| {r['k']} | {1e3 * r['step_s']:.3f} | {1e3 * r['one_token_step_s']:.3f} | {r['ratio']:.2f} |")
    if harness:
        print()
        for r in harness:
            print(f"- {r['what']}: {r['seconds']} s")


if __name__ == "__main__":
    main(sys.argv[1])
