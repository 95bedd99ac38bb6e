"""The on-disk dataset contract (EmpathicStories++-style layout) and its validating loader."""
from empathic_fusion.dataset.contract import (
    PHASES,
    SPEAKERS,
    TRAIT_COLUMNS,
    DatasetError,
    EmpathyDataset,
    Problem,
    load_dataset,
)

__all__ = ["PHASES", "SPEAKERS", "TRAIT_COLUMNS", "DatasetError", "EmpathyDataset", "Problem", "load_dataset"]
