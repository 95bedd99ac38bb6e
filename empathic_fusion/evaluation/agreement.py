"""Rater agreement between two sets of ratings of the same items (human vs model, model A vs B),
as in "Talk, Listen, Connect" (Roshanaei, Rezapour and Seif El-Nasr), section 3.2 and Tables 1-4: RMSE, mean difference, Wasserstein
distance, paired and Welch t-tests, and a multilevel model with a random intercept per item for
nested data (several raters per story).

    python -m empathic_fusion.evaluation.agreement ratings.csv --pair Empathy=human:gpt4o --item story_id --out results/

Each `--pair LABEL=A:B` names two columns of the CSV; each becomes one row of the table. Rows with
a missing value in A or B are left out of that pair (counted in `n_dropped`, with a warning).
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from empathic_fusion.evaluation.plots import rating_distributions, save_figure

COLUMNS = {"n": "n", "mean_a": "Mean A", "std_a": "Std A", "mean_b": "Mean B", "std_b": "Std B", "rmse": "RMSE",
           "mean_diff": "Mean diff", "wasserstein": "Wasserstein dist", "paired_t": "Paired t", "paired_p": "Paired p",
           "welch_t": "Welch t", "welch_p": "Welch p", "mixed_coef": "MixedLM B-A", "mixed_p": "MixedLM p",
           "item_var": "Item variance"}


def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Agreement of paired ratings: mean diff is mean(a - b) ("Talk, Listen, Connect": human minus model)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-D and paired, got shapes {a.shape} and {b.shape}")
    if len(a) < 2:
        raise ValueError(f"need at least 2 paired ratings, got {len(a)}")
    diff = a - b
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # identical columns: t is undefined
        paired = stats.ttest_rel(a, b)
        welch = stats.ttest_ind(a, b, equal_var=False)
    values = {"n": len(a), "mean_a": a.mean(), "std_a": a.std(ddof=1), "mean_b": b.mean(), "std_b": b.std(ddof=1),
              "rmse": float(np.sqrt(np.mean(diff ** 2))), "mean_diff": diff.mean(),
              "wasserstein": stats.wasserstein_distance(a, b),
              "paired_t": paired.statistic, "paired_p": paired.pvalue,
              "welch_t": welch.statistic, "welch_p": welch.pvalue}
    if not np.isfinite(values["paired_t"]):
        warnings.warn("paired t-test undefined (the differences are constant); t = 0, p = 1 reported", stacklevel=2)
        values.update(paired_t=0.0, paired_p=1.0)
    if not np.isfinite(values["welch_t"]):
        warnings.warn("Welch t-test undefined (both sets are constant); t = 0, p = 1 reported", stacklevel=2)
        values.update(welch_t=0.0, welch_p=1.0)
    return {k: float(v) for k, v in values.items()}


def mixed_model(a: np.ndarray, b: np.ndarray, items: np.ndarray) -> dict[str, float]:
    """rating ~ source + (1 | item) with statsmodels MixedLM (REML): the B-minus-A effect net of item means.

    Long format: every pair contributes one A rating and one B rating of its item. Returns the
    source coefficient, its standard error and p-value, the random-intercept variance and whether
    the optimiser converged.
    """
    import statsmodels.formula.api as smf

    a, b, items = np.asarray(a, float), np.asarray(b, float), np.asarray(items)
    if len(np.unique(items)) < 2:
        raise ValueError("a random intercept per item needs at least 2 items")
    long = pd.DataFrame({"rating": np.concatenate([a, b]), "source_b": np.r_[np.zeros(len(a)), np.ones(len(b))],
                         "item": np.concatenate([items, items]).astype(str)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = smf.mixedlm("rating ~ source_b", long, groups=long["item"]).fit(reml=True)
    for warning in caught:
        if "converge" in str(warning.message).lower() or "boundary" in str(warning.message).lower():
            warnings.warn(f"MixedLM: {warning.message}", stacklevel=2)
    return {"mixed_coef": float(fit.params["source_b"]), "mixed_se": float(fit.bse["source_b"]),
            "mixed_p": float(fit.pvalues["source_b"]), "item_var": float(fit.cov_re.iloc[0, 0]),
            "converged": bool(fit.converged)}


def agreement_table(frame: pd.DataFrame, pairs: dict[str, tuple[str, str]], item: str | None = None) -> pd.DataFrame:
    """One row per labelled pair of columns ("Talk, Listen, Connect" Table 1 layout, plus tests and the MixedLM)."""
    needed = {c for pair in pairs.values() for c in pair} | ({item} if item else set())
    missing = sorted(needed - set(frame.columns))
    if missing:
        raise ValueError(f"column(s) {missing} not in the CSV; it has {list(frame.columns)}")
    rows = []
    for label, (col_a, col_b) in pairs.items():
        keep = frame[col_a].notna() & frame[col_b].notna() & (frame[item].notna() if item else True)
        dropped = int((~keep).sum())
        if dropped:
            warnings.warn(f"{label}: {dropped} row(s) with a missing value left out", stacklevel=2)
        part = frame[keep]
        row = {"label": label, "a": col_a, "b": col_b, **agreement(part[col_a].to_numpy(float), part[col_b].to_numpy(float)),
               "n_dropped": dropped}
        if item:
            row.update(mixed_model(part[col_a].to_numpy(float), part[col_b].to_numpy(float), part[item].to_numpy()))
        rows.append(row)
    return pd.DataFrame(rows)


def to_markdown(table: pd.DataFrame, decimals: int = 3) -> str:
    """Markdown (pandas + tabulate) with the "Talk, Listen, Connect" columns first (RMSE, Mean diff,
    Wasserstein dist), then the tests; p-values to `decimals` significant digits."""
    shown = [c for c in COLUMNS if c in table.columns]
    cells = pd.DataFrame({COLUMNS[c]: [str(int(v)) if c == "n" else f"{v:.{decimals}g}" if c.endswith("_p")
                                       else f"{v:.{decimals}f}" for v in table[c]] for c in shown})
    cells.index = [row["label"] if row["label"] == f"{row['a']} vs {row['b']}" else f"{row['label']} ({row['a']} vs {row['b']})"
                   for _, row in table.iterrows()]
    return cells.to_markdown(colalign=("left", *["right"] * len(shown)), disable_numparse=True)


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_").lower() or "pair"


def _parse_pair(text: str) -> tuple[str, tuple[str, str]]:
    label, _, columns = text.rpartition("=")
    col_a, sep, col_b = columns.partition(":")
    if not sep or not col_a or not col_b:
        raise argparse.ArgumentTypeError(f"--pair takes [LABEL=]COLUMN_A:COLUMN_B, got '{text}'")
    return label or f"{col_a} vs {col_b}", (col_a, col_b)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(prog="python -m empathic_fusion.evaluation.agreement", description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path, help="CSV with one row per rated item (or per rater x item)")
    parser.add_argument("--pair", action="append", type=_parse_pair, required=True,
                        help="[LABEL=]COLUMN_A:COLUMN_B, repeatable (e.g. Empathy=human:gpt4o)")
    parser.add_argument("--item", help="column naming the item (story) for the random-intercept MixedLM")
    parser.add_argument("--out", type=Path, help="folder for agreement.md, agreement.csv and one distribution PNG per pair")
    args = parser.parse_args(argv)
    if not args.csv.exists():
        parser.error(f"{args.csv} does not exist")
    table = agreement_table(pd.read_csv(args.csv), dict(args.pair), args.item)
    markdown = to_markdown(table)
    print(markdown)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "agreement.md").write_text(markdown + "\n")
        table.to_csv(args.out / "agreement.csv", index=False)
        frame = pd.read_csv(args.csv)
        for label, (col_a, col_b) in dict(args.pair).items():  # "Talk, Listen, Connect" Figure 2: the two distributions
            keep = frame[col_a].notna() & frame[col_b].notna()
            fig = rating_distributions(frame.loc[keep, col_a], frame.loc[keep, col_b], (col_a, col_b),
                                       title=f"{label}: {col_a} vs {col_b}")
            save_figure(fig, args.out / f"agreement_{_slug(label)}.png")
    return table


if __name__ == "__main__":
    main(sys.argv[1:])
