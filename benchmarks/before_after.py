"""Test metrics of the same runs made by two versions of the code, side by side.

    python benchmarks/before_after.py --before-label 2e57b66 \
        --pair "demo LF-LSTM v+a+t" /tmp/before/demo_lf logs/benchmarks/demo_runs/<time>/lf_lstm_vat \
        --pair "EmpatheticExchanges" <old checkout>/logs/benchmarks/empathetic_exchanges/<time> \
                                     logs/benchmarks/empathetic_exchanges/<time>

Each side of a pair is a run folder (its test_metrics.json) or a sweep folder (every test_metrics.json
under it, e.g. one per fold, paired by relative path). For every metric row the two runs report
(the model and each baseline, per window and per rating), every metric is shown as before / after, with
the largest absolute difference of the row. Rows or metrics only one side reports are shown with "-",
so nothing is dropped from the comparison. Written to docs/results/before_after.md.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import add_output_arguments, write_results  # noqa: E402

# Metric order in the tables; any other metric a report holds follows in name order.
METRIC_ORDER = ["pearson", "spearman", "accuracy", "f1", "mse", "mae", "ccc", "qwk", "macro_f1", "level_accuracy"]
# Top-level keys of test_metrics.json that hold metric rows.
ROW_GROUPS = ("model", "baselines", "constant_baseline")


def metric_rows(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """`{row label: {metric: value}}` for every dict of numbers under the report's metric groups, labelled
    by its path (e.g. `model/rating`, `baselines/TF-IDF + ridge/rating`, `constant_baseline/window`)."""
    rows: dict[str, dict[str, float]] = {}

    def walk(node: Any, path: list[str]) -> None:
        if not isinstance(node, dict):
            return
        numbers = {k: float(v) for k, v in node.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if numbers:
            rows["/".join(path)] = numbers
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, [*path, str(key)])

    for group in ROW_GROUPS:
        walk(report.get(group), [group])
    return rows


def reports(folder: Path) -> dict[str, dict[str, Any]]:
    """`{relative folder: test_metrics.json}` for a run folder or every run under a sweep folder."""
    files = [folder / "test_metrics.json"] if (folder / "test_metrics.json").is_file() else \
        sorted(folder.rglob("test_metrics.json"))
    if not files:
        raise SystemExit(f"no test_metrics.json in or under {folder}")
    return {str(f.parent.relative_to(folder)) if f.parent != folder else ".": json.loads(f.read_text()) for f in files}


def predictions_line(before: Path, after: Path) -> str | None:
    """How far apart the two runs' per-rating predictions are (test_predictions.csv), when both wrote them."""
    import pandas as pd

    files = [folder / "test_predictions.csv" for folder in (before, after)]
    if not all(f.is_file() for f in files):
        return None
    old, new = (pd.read_csv(f) for f in files)
    if len(old) != len(new) or "predicted" not in old or "predicted" not in new:
        return f"test_predictions.csv: {len(old)} rows before, {len(new)} after (not comparable row by row)"
    largest = float((old["predicted"] - new["predicted"]).abs().max()) if len(old) else 0.0
    return f"test_predictions.csv: {len(old)} rows on both sides; largest absolute difference of a prediction: {largest:.2g}"


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def compare(name: str, before: Path, after: Path) -> tuple[str, float]:
    """Markdown section for one pair and the largest absolute difference over all shared values."""
    old, new = reports(before), reports(after)
    lines = [f"## {name}", "", f"before: `{before}`; after: `{after}`", ""]
    largest = 0.0
    for run in sorted(set(old) | set(new), key=lambda r: (len(r), r)):
        old_rows = metric_rows(old[run]) if run in old else {}
        new_rows = metric_rows(new[run]) if run in new else {}
        labels = list(dict.fromkeys([*old_rows, *new_rows]))
        metrics = sorted({m for rows in (old_rows, new_rows) for r in rows.values() for m in r},
                         key=lambda m: (METRIC_ORDER.index(m) if m in METRIC_ORDER else len(METRIC_ORDER), m))
        if run != ".":
            lines += [f"### {run}", ""]
        compared = predictions_line(before / run, after / run)
        if compared:
            lines += [compared, ""]
        lines += ["| row | " + " | ".join(f"{m} before / after" for m in metrics) + " | max abs diff |",
                  "|---" * (len(metrics) + 2) + "|"]
        for label in labels:
            a, b = old_rows.get(label, {}), new_rows.get(label, {})
            diffs = [abs(a[m] - b[m]) for m in metrics if m in a and m in b and not (math.isnan(a[m]) or math.isnan(b[m]))]
            row_max = max(diffs) if diffs else None
            if row_max is not None:
                largest = max(largest, row_max)
            cells = [f"{fmt(a.get(m))} / {fmt(b.get(m))}" for m in metrics]
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {'-' if row_max is None else f'{row_max:.2g}'} |")
        lines.append("")
    return "\n".join(lines), largest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=3, action="append", required=True, metavar=("NAME", "BEFORE", "AFTER"),
                        help="a name and the before and after run (or sweep) folders; repeat for more")
    parser.add_argument("--before-label", default="before", help="what 'before' is, e.g. its commit")
    parser.add_argument("--after-label", default="after", help="what 'after' is (default: this checkout)")
    add_output_arguments(parser, "before_after")
    args = parser.parse_args(argv)
    sections, summary = [], ["| pair | largest absolute difference of a metric |", "|---|---|"]
    for name, before, after in args.pair:
        section, largest = compare(name, Path(before), Path(after))
        sections.append(section)
        summary.append(f"| {name} | {largest:.2g} |")
    body = (f"Test metrics of the same commands and seeds: before = {args.before_label}, after = {args.after_label}. "
            "Each cell is before / after.\n\n" + "\n".join(summary) + "\n\n" + "\n".join(sections))
    print(body)
    write_results(args, "Before and after: same seeds, same test metrics?", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
