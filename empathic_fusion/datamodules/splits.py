"""Participant-level train/val/test splits, seeded and persisted with a hash so runs can cite them."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from empathic_fusion.core.files import atomic_write_text, canonical_hash

log = logging.getLogger(__name__)
SPLITS = ("train", "val", "test")


def split_participants(participant_ids: list[str], fractions: tuple[float, float, float], seed: int) -> dict[str, str]:
    """participant -> split; val and test get at least one participant each when there are three or more."""
    if abs(sum(fractions) - 1.0) > 1e-6 or min(fractions) < 0:
        raise ValueError(f"split fractions must be non-negative and sum to 1, got {fractions}")
    ids = sorted(participant_ids)
    n = len(ids)
    order = np.random.default_rng(seed).permutation(n)
    n_test = int(round(fractions[2] * n))
    n_val = int(round(fractions[1] * n))
    if n >= 3:
        n_test, n_val = max(n_test, 1 if fractions[2] > 0 else 0), max(n_val, 1 if fractions[1] > 0 else 0)
    n_train = n - n_val - n_test
    names = ["train"] * n_train + ["val"] * n_val + ["test"] * n_test
    return {ids[i]: names[k] for k, i in enumerate(order)}


def load_or_create_split(path: Path, participant_ids: list[str], fractions: tuple[float, float, float],
                         seed: int) -> tuple[dict[str, str], str]:
    """Reuse the persisted split when it covers the same participants, else create and persist one."""
    fractions = tuple(float(f) for f in fractions)
    if path.exists():
        saved = json.loads(path.read_text())
        if sorted(saved["assignment"]) == sorted(participant_ids) and tuple(saved["fractions"]) == fractions \
                and saved["seed"] == seed:
            return saved["assignment"], saved["hash"]
        log.warning("split file %s covers other participants or settings; writing a new split", path)
    assignment = split_participants(participant_ids, fractions, seed)
    split_hash = canonical_hash(assignment)
    atomic_write_text(path, json.dumps({"seed": seed, "fractions": fractions, "hash": split_hash,
                                         "assignment": assignment}, indent=1, sort_keys=True))
    return assignment, split_hash


def participant_folds(participant_ids: list[str], n_folds: int, fold: int, val_fraction: float,
                      seed: int) -> dict[str, str]:
    """Participant-grouped K-fold: fold `fold` of `n_folds` is the test split, every participant is in
    exactly one test fold; `val_fraction` of the others (at least one) is held out for checkpoint selection.

    Folds come from one seeded permutation dealt round-robin, so fold sizes differ by at most one.
    """
    ids = sorted(participant_ids)
    if not 2 <= n_folds <= len(ids):
        raise ValueError(f"cross-validation needs 2 <= cv_folds <= number of participants ({len(ids)}), got {n_folds}")
    if not 0 <= fold < n_folds:
        raise ValueError(f"cv_fold must be in 0..{n_folds - 1}, got {fold}")
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    order = [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]
    test = set(order[fold::n_folds])
    rest = [p for p in order if p not in test]
    n_val = max(int(round(val_fraction * len(rest))), 1 if val_fraction > 0 and len(rest) > 1 else 0)
    val = set(rest[:n_val])
    return {p: "test" if p in test else "val" if p in val else "train" for p in ids}
