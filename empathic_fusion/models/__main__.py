"""`python -m empathic_fusion.models`: every model a config can name (`model=<name>`), with the module that
trains it and its name in the paper's tables."""
from __future__ import annotations

from empathic_fusion.core.registry import MODELS
from empathic_fusion.models import list_models


def main() -> None:
    names = list_models()
    width = max(len(name) for name in names)
    print(f"{'model':<{width}}  module  paper table")
    for name in names:
        entry = MODELS[name]
        print(f"{name:<{width}}  {entry.module:<6}  {entry.display}")


if __name__ == "__main__":
    main()
