#!/usr/bin/env python3
"""Sums fuzz/record.tsv (one line per target per `make fuzz-long` run) into the cumulative table of
docs/reliability.md, between its fuzz-record markers.

    python3 fuzz/record.py fuzz/record.tsv docs/reliability.md

Columns of the record: date, target, seconds, executions, corpus (inputs/size), coverage (edges),
peak RSS (MB), crashes (0 or 1). A target's corpus and coverage are those of its latest run (the
long runs keep their corpus, so they grow); seconds, executions and crashes add up.
"""
import sys

BEGIN = "<!-- fuzz-record:begin (fuzz/record.py writes this table) -->"
END = "<!-- fuzz-record:end -->"
GOAL_SECONDS = 3600  # issue 37: at least one CPU-hour per target, cumulatively


def main(record_path, doc_path):
    targets = {}
    days = set()
    with open(record_path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            cols = line.split("\t")
            if len(cols) != 8:
                sys.exit(f"{record_path}:{n}: {len(cols)} columns, want 8")
            day, name, took, execs, corp, cov, peak, crashes = cols
            t = targets.setdefault(name, {"runs": 0, "seconds": 0, "execs": 0, "crashes": 0,
                                          "peak": 0, "corp": "?", "cov": "?", "last": ""})
            t["runs"] += 1
            t["seconds"] += int(took)
            t["execs"] += int(execs) if execs.isdigit() else 0
            t["crashes"] += int(crashes)
            t["peak"] = max(t["peak"], int(peak) if peak.isdigit() else 0)
            t["corp"], t["cov"], t["last"] = corp, cov, day
            days.add(day)
    rows = ["| target | runs | CPU time | of the hour | executions | corpus (latest) | coverage (latest) "
            "| peak RSS | crashes | latest run |",
            "|---|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for name in sorted(targets):
        t = targets[name]
        rows.append(f"| `{name}` | {t['runs']} | {t['seconds'] / 60:.1f} min | "
                    f"{min(100, 100 * t['seconds'] // GOAL_SECONDS)}% | {t['execs']:,} | {t['corp']} | "
                    f"{t['cov']} | {t['peak']} MB | {t['crashes']} | {t['last']} |")
    total = sum(t["seconds"] for t in targets.values())
    rows.append("")
    rows.append(f"{len(targets)} targets, {total / 3600:.2f} CPU-hours in all, runs from "
                f"{min(days) if days else '-'} to {max(days) if days else '-'}; the goal is one "
                "CPU-hour per target. A crash counted here is fixed and its input kept in "
                "`fuzz/regressions/<target>/`.")
    with open(doc_path) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        sys.exit(f"{doc_path}: no fuzz-record markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(doc_path, "w") as f:
        f.write(head + BEGIN + "\n" + "\n".join(rows) + "\n" + END + tail)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
