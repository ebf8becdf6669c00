"""Plain-text tables for the benchmark reports (run.py's read table, write_bench.py's)."""

from __future__ import annotations


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
