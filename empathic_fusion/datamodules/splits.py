"""The one splitter of the project, on scikit-learn's group splitters: a group (a participant, a writer, a
conversation) is never split between train, validation and test.

The fusion data splits participants (`split_participants`, persisted with a hash by `load_or_create_split`
so runs can cite them; `participant_folds` for K-fold); the text tables (empathic_fusion/datamodules/text_table.py)
split rows grouped by their group column with the same `group_folds` and `group_holdout`.
"""
from __future__ import annotations

import errno
import json
import logging
from pathlib import Path
from typing import Sequence

import numpy as np
from sklearn.model_selection import GroupKFold, GroupShuffleSplit, KFold, StratifiedGroupKFold

from empathic_fusion.core.errors import UserError
from empathic_fusion.core.files import atomic_write_text, canonical_hash

log = logging.getLogger(__name__)
SPLITS = ("train", "val", "test")
# which code draws the splits: a persisted split made by another splitter is redrawn (the same seed would
# give other participants), so a store that outlived an upgrade splits like a fresh one
SPLITTER = "sklearn-group-shuffle-1"
MAX_STRATA = 20  # more distinct levels than this (a continuous label): grouped folds without stratification

Folds = list[tuple[np.ndarray, np.ndarray]]


def group_folds(n_rows: int, n_folds: int, seed: int, groups: Sequence | np.ndarray | None = None,
                strata: np.ndarray | None = None) -> Folds:
    """(train rows, test rows) of each of `n_folds` folds; every row is tested once and a group never
    spans two folds (seeded).

    With `strata` of 2..MAX_STRATA levels, StratifiedGroupKFold keeps each fold's levels near the whole
    table's; otherwise GroupKFold over a seeded relabelling of the groups (it breaks ties between
    equal-sized groups by label order), which keeps fold sizes within one group of each other. Without
    groups every row is its own group: shuffled KFold."""
    rows = np.zeros(n_rows)
    if groups is None:
        if n_rows < n_folds:
            raise ValueError(f"{n_rows} rows cannot fill {n_folds} folds")
        return list(KFold(n_splits=n_folds, shuffle=True, random_state=seed).split(rows))
    groups = np.asarray(groups).astype(str)
    unique = np.unique(groups)
    if len(unique) < n_folds:
        raise ValueError(f"{len(unique)} groups cannot fill {n_folds} folds")
    if strata is not None and 1 < len(np.unique(strata)) <= MAX_STRATA:
        splitter = StratifiedGroupKFold(n_splits=n_folds, shuffle=True, random_state=seed)
        return list(splitter.split(rows, strata, groups))
    relabel = dict(zip(unique, np.random.default_rng(seed).permutation(len(unique))))
    codes = np.array([relabel[g] for g in groups])
    return list(GroupKFold(n_splits=n_folds).split(rows, groups=codes))


def group_holdout(groups: Sequence | np.ndarray, n_held: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept rows, held-out rows): `n_held` whole groups, drawn at random (seeded) by GroupShuffleSplit."""
    groups = np.asarray(groups).astype(str)
    rows = np.arange(len(groups))
    if n_held <= 0:
        return rows, rows[:0]
    kept, held = next(GroupShuffleSplit(n_splits=1, test_size=int(n_held), random_state=seed)
                      .split(rows, groups=groups))
    return np.sort(kept), np.sort(held)


def _held_count(fraction: float, n: int, at_least_one: bool) -> int:
    return max(int(round(fraction * n)), 1 if at_least_one and fraction > 0 else 0)


def split_participants(participant_ids: list[str], fractions: tuple[float, float, float], seed: int) -> dict[str, str]:
    """participant -> split (the fractions are the schema's data.split_fractions); val and test get at
    least one participant each when there are three or more. Test participants are drawn first, then
    validation from the rest, each a seeded GroupShuffleSplit over participants."""
    ids = np.array(sorted(participant_ids))
    n = len(ids)
    n_test = _held_count(fractions[2], n, n >= 3)
    n_val = _held_count(fractions[1], n, n >= 3)
    rest, test = group_holdout(ids, n_test, seed)
    _, val = group_holdout(ids[rest], n_val, seed)
    return _assignment(ids, test, rest[val])


def load_or_create_split(path: Path, participant_ids: list[str], fractions: tuple[float, float, float],
                         seed: int) -> tuple[dict[str, str], str]:
    """Reuse the persisted split when it covers the same participants, else create and persist one. A
    folder that cannot be written (a read-only store) keeps the new split in memory for this run, with a
    note: it is drawn from the seed, so the next run draws the same one."""
    fractions = tuple(float(f) for f in fractions)
    if path.exists():
        saved = json.loads(path.read_text())
        if sorted(saved["assignment"]) == sorted(participant_ids) and tuple(saved["fractions"]) == fractions \
                and saved["seed"] == seed and saved.get("splitter") == SPLITTER:
            return saved["assignment"], saved["hash"]
        log.warning("split file %s covers other participants or settings, or another splitter made it; writing a "
                    "new split", path)
    assignment = split_participants(participant_ids, fractions, seed)
    split_hash = canonical_hash(assignment)
    try:
        atomic_write_text(path, json.dumps({"seed": seed, "fractions": fractions, "hash": split_hash,
                                             "splitter": SPLITTER, "assignment": assignment}, indent=1, sort_keys=True))
    except OSError as error:
        if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        log.warning("split file %s cannot be written (%s): the split (hash %s) is used without being saved; it is "
                    "drawn from data.split_seed=%s, so runs on these participants draw the same one", path,
                    error.strerror, split_hash, seed)
    return assignment, split_hash


def participant_folds(participant_ids: list[str], n_folds: int, fold: int, val_fraction: float,
                      seed: int) -> dict[str, str]:
    """Participant-grouped K-fold: fold `fold` of `n_folds` is the test split, every participant is in
    exactly one test fold (fold sizes differ by at most one); `val_fraction` of the others (at least
    one) is held out for checkpoint selection. `fold` and `val_fraction` come from the checked data
    config (data.cv_fold, data.split_fractions); the number of participants comes from the data."""
    ids = np.array(sorted(participant_ids))
    if n_folds > len(ids):
        raise ValueError(f"cross-validation needs data.cv_folds <= number of participants ({len(ids)}), "
                         f"got {n_folds}")
    rest, test = group_folds(len(ids), n_folds, seed, groups=ids)[fold]
    _, val = group_holdout(ids[rest], _held_count(val_fraction, len(rest), len(rest) > 1), seed)
    return _assignment(ids, test, rest[val])


def _assignment(ids: np.ndarray, test: np.ndarray, val: np.ndarray) -> dict[str, str]:
    """participant -> split from the positions in `ids` of the test and validation participants."""
    names = np.full(len(ids), "train", dtype=object)
    names[test], names[val] = "test", "val"
    return dict(zip(ids.tolist(), names.tolist()))


class TooFewParticipantsError(UserError, ValueError):
    """The participants cannot fill a train, a validation and a test split with these settings."""


def split_sizes(n: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    """Participants in (train, val, test) that `split_participants` gives `n` participants."""
    n_test = _held_count(fractions[2], n, n >= 3)
    n_val = _held_count(fractions[1], n, n >= 3)
    return n - n_test - n_val, n_val, n_test


def fold_sizes(n: int, n_folds: int, val_fraction: float) -> list[tuple[int, int, int]]:
    """(train, val, test) participants of each fold `participant_folds` makes of `n` participants."""
    if n_folds > n:
        return [(0, 0, 0)]
    sizes = []
    for test in (n // n_folds + (1 if k < n % n_folds else 0) for k in range(n_folds)):
        rest = n - test
        val = _held_count(val_fraction, rest, rest > 1)
        sizes.append((rest - val, val, test))
    return sizes


def _sizes(n: int, fractions: tuple[float, float, float], cv_folds: int) -> list[tuple[int, int, int]]:
    """(train, val, test) participants of the split, or of each fold with cv_folds > 1."""
    if cv_folds > 1:
        return fold_sizes(n, cv_folds, fractions[1] / (fractions[0] + fractions[1]))
    return [split_sizes(n, fractions)]


def _fills(n: int, fractions: tuple[float, float, float], cv_folds: int) -> bool:
    return all(min(sizes) >= 1 for sizes in _sizes(n, fractions, cv_folds))


def check_participants(participant_ids: Sequence[str], fractions: tuple[float, float, float], cv_folds: int,
                       who: str = "participants with ratings") -> None:
    """Stop, before anything is extracted or trained, when these participants cannot give every split (train,
    val, test; of every fold with cv_folds > 1) at least one participant: how many there are, which split
    stays empty, how many the settings need, and a setting that works with these participants where one does."""
    ids = sorted(set(participant_ids))
    n = len(ids)
    if _fills(n, fractions, cv_folds):
        return
    named = ", ".join(ids[:5]) + (f" and {n - 5} more" if n > 5 else "")
    folds = _sizes(n, fractions, cv_folds)
    fold, sizes = next((k, s) for k, s in enumerate(folds) if min(s) < 1)
    empty = SPLITS[sizes.index(min(sizes))] if n >= cv_folds else "test"
    setting = f"data.cv_folds={cv_folds}" if cv_folds > 1 else f"data.split_fractions={list(fractions)}"
    where = f" of fold {fold}" if cv_folds > 1 and n >= cv_folds else ""
    needed = next((m for m in range(n + 1, 1000) if _fills(m, fractions, cv_folds)), None)
    opening = "the dataset is too small to split" if needed is not None else "the split settings leave a split empty"
    message = (f"{opening}: {n} {who} ({named}), and {setting} leaves the {empty} split{where} without one"
               + (f" (it needs at least {needed})" if needed is not None else ""))
    options = []
    if cv_folds > 1:
        fewer = [k for k in range(cv_folds - 1, 1, -1) if _fills(n, fractions, k)]
        if fewer:
            options.append(f"data.cv_folds={fewer[0]}")
    if _fills(n, (0.6, 0.2, 0.2), 0):
        options.append(("data.cv_folds=0 " if cv_folds > 1 else "") + "data.split_fractions=[0.6,0.2,0.2]")
    advice = (f". {' or '.join(options)} gives every split one of them" if options
              else ". A train, a validation and a test split need 3 participants at the least: add participants")
    raise TooFewParticipantsError(message + advice)
