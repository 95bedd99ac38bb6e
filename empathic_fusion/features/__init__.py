"""Feature extraction from raw media into a per-session, frame-level feature store.

Importing the package declares every feature branch: each extractor file of it registers its own
(branch_unit.py), so the branch registry and the `features` config schema know them all before any
config is composed, checked or read. A pickled config names its schema `empathic_fusion.features.FeaturesSchema`
(config/features.py), so a process that unpickles one (a sweep's job) declares the branches first.
"""
from empathic_fusion.config.features import features_schema
from empathic_fusion.features.branch_unit import discover_branches

discover_branches()


def __getattr__(name: str) -> type:
    """`FeaturesSchema`: the `features` schema with every declared branch's section."""
    if name == "FeaturesSchema":
        return features_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
