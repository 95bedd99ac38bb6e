"""Results per participant group (`evaluation.groups`): does a model work equally well for everyone?

For each attribute (a participants.csv column for fusion models, a text table's column for text
models) the evaluated rows are split into groups: a numeric attribute with more than
`evaluation.group_bins` distinct values into quantile bins of the evaluated participants (labelled with
their value ranges), any other one by its values; a missing value puts a row in no group (counted).
Groups with fewer than `evaluation.min_group_size` participants are never reported alone: they are
pooled, and a pool that is still too small takes in the smallest reported group until it is big
enough; with fewer than two groups left the attribute is not broken down. Each group's Pearson r and
MSE get a percentile CI from the same participant resamples as `bootstrap_ci` (participants.py: same
seed, whole evaluated set), so the largest gap between two groups gets its CI from those resamples too.
Only aggregates go to the loggers.
"""
from __future__ import annotations

import itertools
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from empathic_fusion.config.checks import ConfigError
from empathic_fusion.evaluation.participants import (Scale, check_prediction_table, half_range, on_scale,
                                                     participant_resamples)
from empathic_fusion.metrics import metric_values

GROUP_METRICS = {"pearson": "r", "mse": "MSE"}  # metric -> its name in the tables


def check_attributes(names: list[str], available: list[str], source: str) -> None:
    """A ConfigError naming every unknown attribute of `evaluation.groups` and the available ones."""
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ConfigError([f"evaluation.groups={list(names)}: {unknown} not among the attributes of {source}; "
                           f"available: {list(available)}"])


def check_groups(module: Any, datamodule: Any, evaluation: dict[str, Any]) -> None:
    """An unknown `evaluation.groups` attribute of a module's data (its `group_attributes`) is a ConfigError
    listing the available ones: before the report's bootstrap, and in train.py before training."""
    if evaluation.get("groups"):
        check_attributes(list(evaluation["groups"]), *module.group_attributes(datamodule))


def _numeric(values: pd.Series) -> pd.Series | None:
    """The values as numbers when every non-missing one is a number, else None (categorical)."""
    numbers = pd.to_numeric(values, errors="coerce")
    return numbers if numbers.notna().sum() == values.notna().sum() else None


def group_labels(table: pd.DataFrame, values: pd.Series, bins: int) -> tuple[pd.Series, list[str], str]:
    """Each row's group label from its attribute `values` (NaN where missing), the labels in order, and
    how they were made. Quantile edges come from one value per participant, so a participant with many
    rows weighs like one with few."""
    numbers = _numeric(values)
    present = values.notna()
    if numbers is not None and numbers[present].nunique() > bins:
        per_participant = numbers[present].groupby(table.loc[present, "participant_id"]).unique().explode()
        edges = np.unique(np.quantile(per_participant.to_numpy(float), np.linspace(0, 1, bins + 1)))
        names = [f"[{edges[0]:g}, {edges[1]:g}]"] + [f"({lo:g}, {hi:g}]" for lo, hi in zip(edges[1:-1], edges[2:])]
        codes = pd.cut(numbers, edges, include_lowest=True, labels=False)
        labels = pd.Series([names[int(c)] if not math.isnan(c) else np.nan for c in codes], index=table.index,
                           dtype=object)
        return labels, [n for n in names if (labels == n).any()], f"{len(names)} quantile bins"
    if numbers is not None:
        order = sorted(numbers[present].unique())
        text = {v: f"{v:g}" for v in order}
        labels = pd.Series([text[v] if present[i] else np.nan for i, v in numbers.items()], index=table.index,
                           dtype=object)
        return labels, [text[v] for v in order], "values"
    labels = values.where(present).map(lambda v: v if pd.isna(v) else str(v)).astype(object)
    return labels, sorted(labels[present].unique()), "values"


def pool_small(members: dict[str, set], order: list[str], min_size: int) -> dict[str, str]:
    """Original label -> reported label. Groups under `min_size` participants join one pool, "other
    (pooled: k groups)"; while the pool is still under `min_size` it takes in the smallest reported group.
    A label mapped to None is not reported (a pool that stayed too small)."""
    reported = [g for g in order if len(members[g]) >= min_size]
    pooled = [g for g in order if len(members[g]) < min_size]
    pool = set().union(*(members[g] for g in pooled)) if pooled else set()
    while pooled and len(pool) < min_size and reported:
        smallest = min(reported, key=lambda g: len(members[g]))
        reported.remove(smallest)
        pooled.append(smallest)
        pool |= members[smallest]
    mapping = {g: g for g in reported}
    pool_label = f"other (pooled: {len(pooled)} groups)" if len(pool) >= min_size else None
    mapping.update({g: pool_label for g in pooled})
    return mapping


def _interval(draws: np.ndarray, estimate: float, confidence: float) -> dict[str, float]:
    if not len(draws) or np.isnan(draws).all():
        return {"estimate": estimate, "low": math.nan, "high": math.nan}
    alpha = (1 - confidence) / 2
    low, high = np.nanquantile(draws, [alpha, 1 - alpha])
    return {"estimate": estimate, "low": float(low), "high": float(high)}


def attribute_breakdown(table: pd.DataFrame, values: pd.Series, min_size: int, bins: int, n_boot: int,
                        confidence: float, seed: int, scale: Scale) -> dict[str, Any]:
    """Groups of one attribute (its `values` per row of `table`): participants, ratings, r and MSE with
    CIs, and the largest gaps."""
    labels, order, kind = group_labels(table, values, bins)
    missing = labels.isna()
    members = {g: set(table.loc[labels == g, "participant_id"]) for g in order}
    mapping = pool_small(members, order, min_size)
    pooled = {label for g, label in mapping.items() if label is not None and label != g}
    reported = [g for g in order if mapping[g] == g] + sorted(pooled)  # the pool last
    result: dict[str, Any] = {"kind": kind, "missing": {"participants": int(table.loc[missing, "participant_id"].nunique()),
                                                        "ratings": int(missing.sum())}}
    if len(reported) < 2:
        result.update(broken_down=False, groups=[], gaps={},
                      note=f"not broken down: fewer than two groups of at least {min_size} participants")
        return result
    final = labels.map(lambda g: g if pd.isna(g) else mapping[g])
    participants = sorted(table["participant_id"].unique())
    pred = on_scale(table["predicted"].to_numpy(float), scale)
    true = on_scale(table["rated"].to_numpy(float), scale)
    errors = half_range(scale)  # MSE on the rating scale (metrics.py)
    ids, group_of = table["participant_id"].to_numpy(), final.to_numpy()
    # rows of each (group, participant): a resample concatenates them per group
    parts = {g: [np.flatnonzero((group_of == g) & (ids == p)) for p in participants] for g in reported}
    estimates = {g: metric_values(pred[np.concatenate(parts[g])], true[np.concatenate(parts[g])], half_range=errors)
                 for g in reported}
    draws = {g: np.full((max(n_boot, 0), len(GROUP_METRICS)), np.nan) for g in reported}
    if n_boot > 0 and len(participants) >= 2:
        for b, pick in enumerate(participant_resamples(len(participants), n_boot, seed)):  # those of bootstrap_ci
            for g in reported:
                rows = np.concatenate([parts[g][i] for i in pick])
                if len(rows):  # a group none of whose participants was drawn has no value in this resample
                    values = metric_values(pred[rows], true[rows], half_range=errors)
                    draws[g][b] = [values[m] for m in GROUP_METRICS]
    else:
        draws = {g: np.empty((0, len(GROUP_METRICS))) for g in reported}
    groups = []
    for g in reported:
        in_group = final == g
        groups.append({"group": g, "n_participants": int(table.loc[in_group, "participant_id"].nunique()),
                       "n_ratings": int(in_group.sum()),
                       **{m: _interval(draws[g][:, j], estimates[g][m], confidence)
                          for j, m in enumerate(GROUP_METRICS)}})
    gaps = {}
    for j, m in enumerate(GROUP_METRICS):
        a, b = max(itertools.combinations(reported, 2),
                   key=lambda pair: abs(estimates[pair[0]][m] - estimates[pair[1]][m]))
        if estimates[a][m] < estimates[b][m]:
            a, b = b, a
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NaN where one group was not drawn
            diff = draws[a][:, j] - draws[b][:, j]
        gaps[m] = {"groups": [a, b], **_interval(diff, estimates[a][m] - estimates[b][m], confidence)}
    result.update(broken_down=True, groups=groups, gaps=gaps, note=None)
    return result


def _cell(value: dict[str, float]) -> str:
    if math.isnan(value["low"]):
        return f"{value['estimate']:.3f}"
    return f"{value['estimate']:.3f} [{value['low']:.3f}, {value['high']:.3f}]"


def format_groups(breakdown: dict[str, dict[str, Any]], confidence: float, min_size: int, scale_name: str) -> str:
    """Markdown: one row per attribute and group, then the largest gaps and missing values per attribute."""
    rows, gaps = [], []
    for attribute, result in breakdown.items():
        if not result["broken_down"]:
            rows.append({"attribute": attribute, "group": result["note"]})
        for group in result["groups"]:
            rows.append({"attribute": attribute, "group": group["group"], "participants": str(group["n_participants"]),
                         "ratings": str(group["n_ratings"]), **{name: _cell(group[m]) for m, name in GROUP_METRICS.items()}})
        gap_cells = {f"largest {name} gap": (f"{' − '.join(result['gaps'][m]['groups'])}: {_cell(result['gaps'][m])}"
                                             if result["gaps"] else "")
                     for m, name in GROUP_METRICS.items()}
        gaps.append({"attribute": attribute, "groups": len(result["groups"]),
                     "missing (participants/ratings)": f"{result['missing']['participants']}/{result['missing']['ratings']}",
                     **gap_cells})
    frame = pd.DataFrame(rows).fillna("")
    table = frame.to_markdown(index=False, colalign=["left"] * len(frame.columns))
    gap_table = pd.DataFrame(gaps).to_markdown(index=False, colalign=["left"] * len(gaps[0]))
    return (f"Per group (evaluation.groups; r and MSE on {scale_name}; {confidence:.0%} bootstrap CI resampling "
            f"participants; groups, pooled ones too, have at least {min_size} participants):\n\n{table}\n\n"
            f"Largest gap between two groups (the first minus the second, CI from the same resamples):\n\n{gap_table}")


def group_results(table: pd.DataFrame, attributes: pd.DataFrame, evaluation: dict[str, Any], scale: Scale,
                  out_dir: Path, scale_name: str, loggers=()) -> tuple[dict[str, Any], str]:
    """The group report of `table` (participant_id, predicted, rated) by each column of `attributes` (the
    attributes of its rows, same index; "" without columns): writes
    test_groups.csv, logs per attribute the number of groups and the largest gaps (aggregates only),
    and returns (the "groups" entry of test_metrics.json, its markdown table; "" without attributes)."""
    if not len(attributes.columns):
        return {}, ""
    check_prediction_table(table)
    if not attributes.index.equals(table.index):
        raise ValueError("the attributes' rows are not the table's rows")
    min_size, confidence = int(evaluation["min_group_size"]), float(evaluation["confidence"])
    breakdown = {a: attribute_breakdown(table, attributes[a], min_size, int(evaluation["group_bins"]), int(evaluation["bootstrap"]),
                                        confidence, int(evaluation["bootstrap_seed"]), scale)
                 for a in attributes.columns}
    rows = []
    for attribute, result in breakdown.items():
        if not result["broken_down"]:
            rows.append({"attribute": attribute, "group": "", "note": result["note"]})
        for group in result["groups"]:
            rows.append({"attribute": attribute, "group": group["group"], "n_participants": group["n_participants"],
                         "n_ratings": group["n_ratings"],
                         **{f"{m}{suffix}": group[m][key] for m in GROUP_METRICS
                            for suffix, key in (("", "estimate"), ("_low", "low"), ("_high", "high"))}})
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {c: "Int64" for c in ("n_participants", "n_ratings") if any(c in row for row in rows)}
    pd.DataFrame(rows).astype(counts).to_csv(out_dir / "test_groups.csv", index=False)  # counts stay integers
    logged = {}
    for attribute, result in breakdown.items():
        logged[f"test/groups/{attribute}/n_groups"] = float(len(result["groups"]))
        for m, name in GROUP_METRICS.items():
            if result["gaps"]:
                logged[f"test/groups/{attribute}/{name.lower()}_gap"] = float(result["gaps"][m]["estimate"])
    for logger in loggers:
        logger.log_metrics(logged)
    summary = {"min_group_size": min_size, "group_bins": int(evaluation["group_bins"]), "attributes": breakdown}
    return summary, format_groups(breakdown, confidence, min_size, scale_name)
