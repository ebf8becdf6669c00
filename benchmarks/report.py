"""Plain-text output of the benchmarks: progress lines and the tables of the reports (run.py's
read table, write_bench.py's)."""

from __future__ import annotations

import time

MB = 1_000_000              # MB/s are 10^6 value bytes per second


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def print_grouped_table(header: tuple, rows: list[tuple], left: int, group: int = 1) -> None:
    """``rows`` under ``header``, the first ``left`` columns left-aligned and the rest
    right-aligned, with a blank line wherever the first ``group`` columns change."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = "  ".join("{:<%d}" % w if i < left else "{:>%d}" % w for i, w in enumerate(widths))
    print(line.format(*header))
    print("  ".join("-" * w for w in widths))
    last = None
    for row in rows:
        if last is not None and row[:group] != last:
            print()
        print(line.format(*row))
        last = row[:group]
