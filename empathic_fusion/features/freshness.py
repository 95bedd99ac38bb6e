"""Is a stored branch still what the dataset and config would give? One answer for training (mask or
stop) and for reports; extraction asks the same question through `branch_signature` and `is_fresh`."""
from __future__ import annotations

from empathic_fusion.core.errors import UserError
from empathic_fusion.dataset import EmpathyDataset
from empathic_fusion.features.extract import branch_signature, signature_difference, signature_matches
from empathic_fusion.features.store import FeatureStore


class StaleFeaturesError(UserError, RuntimeError):
    """Stored features that no longer match the dataset or config (or are damaged), with on_stale=error."""


def branch_problem(store: FeatureStore, dataset: EmpathyDataset, sid: str, branch: str, entry: dict,
                   features: dict, identity: str) -> str | None:
    """Why a recorded branch must not be read, or None: stale (its recorded signature differs from what
    `branch_signature` gives for the dataset and config now) or damaged (a file fails the cheap check).
    `features` is a with_defaults() config, `identity` the text encoder's."""
    try:
        expected = branch_signature(store, dataset, sid, branch, features, identity)
    except (OSError, ValueError) as error:
        return f"stale: its input can no longer be read ({error})"
    if not signature_matches(entry["signature"], expected):
        return (f"stale: the stored features were extracted from other inputs or settings than the dataset and "
                f"config now give ({signature_difference(entry['signature'], expected)} changed)")
    problems = store.check_branch(sid, branch)
    return f"damaged: {'; '.join(problems)}" if problems else None
