#!/usr/bin/env python3
"""Turns kv_attention_bench's JSON into docs/kv-attention.md (a table and the command)."""
import json
import platform
import subprocess
import sys

data = json.load(open(sys.argv[1]))
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                     capture_output=True, text=True).stdout.strip()
rows = []
for b in data["benchmarks"]:
    name = b["name"].split("/")
    kind, type_ = b["label"].rsplit(" ", 1)
    us = b["real_time"]
    rows.append((kind, type_, int(name[2]), int(b["rows_read"]), b["MB_read"], us,
                 1e6 / us, b["floor_us"], b["floor_us"] / us, b["build_us"], b["bw_GB/s"]))

print("# Decode attention at Muse Glimmer shapes\n")
print("One decode step's attention through `Step::update_and_attend` (write the new K/V row, attend")
print("32 query heads over 2 KV heads of dim 128), timed around `ggml_backend_graph_compute` only;")
print("graph building and allocation are reported apart (`build`). The floor is the time to read")
print("the K and V rows once at the measured read bandwidth.\n")
print(f"Machine: {cpu}, {data['context'].get('num_cpus')} CPUs, 2 threads; read bandwidth "
      f"{rows[0][10]:.1f} GB/s (2 threads, 512 MiB). Date: {data['context']['date']}.\n")
print("Command: `make bench-kv` (runs `build/bin/kv_attention_bench` and this report).\n")
print("| layer | storage | history | rows read | MB read | time (µs) | tokens/s | floor (µs) | floor / time | build (µs) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.2f} | {r[5]:.0f} | {r[6]:.0f} | {r[7]:.0f} | {r[8]:.2f} | {r[9]:.1f} |")
print()
print("Reading: the ring layer reads its 2,559 rows whatever the history (window 2048 + max_write")
print("512 - 1), so its cost is flat from 8K to 32K, where the global layer's grows with the")
print("history. Every row is far from the bandwidth floor: ggml's CPU flash attention walks the K/V")
print("rows once per query head, so with 16 query heads per KV head it is compute-bound (f16 dot")
print("products per head), and q8_0 adds a per-row dequantization of V. A kernel that reads each")
print("K/V row once for all query heads of its group is the lever (see the performance issue).")
