"""A mistyped setting on the command line, reported as one message with a "did you mean".

Hydra stops at `model=tfm` (no such option in a config group) and `data.dataset_dr=x` (no such key)
before any code of ours runs. Its own report lists the schemas this package registers in the group
(`schema_fusion_model`) among the options, adds its config search path, and for a key advises
`+data.dataset_dr=x`, which the key's schema refuses as well. `composition_message` says instead which
options or keys there are and the closest ones (difflib); `readable_composition_errors` prints it alone,
with exit status 1, while a console script runs (HYDRA_FULL_ERROR=1 keeps Hydra's report and traceback).
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from empathic_fusion.config import SCHEMAS
from empathic_fusion.core.errors import did_you_mean

SCHEMA_NAMES = frozenset(name for _, name in SCHEMAS)  # configs that are schemas, never a choice


def _missing_option(error: MissingConfigException) -> str | None:
    """`model=tfm`: the group's options (schemas left out) and the closest."""
    group, _, option = str(error.missing_cfg_file or "").rpartition("/")
    if not group or not error.options:
        return None
    options = [o for o in error.options if o not in SCHEMA_NAMES]
    parent = re.match(r"In '([^']+)': ", str(error))
    where = f" (named in {parent[1]}.yaml)" if parent and "/" in parent[1] and parent[1] != "hydra/config" else ""
    return (f"{group}={option}{where}: '{option}' is not an option of the config group '{group}'"
            f"{did_you_mean(option, options, lambda c: f'{group}={c}')}\n"
            f"the options: {', '.join(options)}")


def _unknown_key(error: ConfigCompositionException) -> str | None:
    """`data.dataset_dr=x`: the closest keys where it was looked for, else all of them; adding it with `+`
    is advised only where no schema fixes the keys (a free-form node such as a model's `net`)."""
    cause = error.__cause__
    parent, key = getattr(cause, "parent_node", None), getattr(cause, "key", None)
    line = re.search(r"use \+(\S+?)=(.*)$", str(error), re.MULTILINE)  # Hydra quotes the override typed
    if (not isinstance(cause, OmegaConfBaseException) or not isinstance(parent, DictConfig) or key is None
            or not str(error).startswith("Could not override") or line is None or key in parent):
        return None
    full_key, value = line[1], line[2]
    prefix = full_key[: len(full_key) - len(str(key))]  # "data." for data.dataset_dr
    keys = [str(k) for k in parent.keys()]
    schema = OmegaConf.get_type(parent)
    free_form = schema in (None, dict)
    owner = (prefix.rstrip(".") or "the config") + ("" if free_form else f" ({schema.__name__})")
    hint = did_you_mean(str(key), keys, lambda c: f"{prefix}{c}={value}")
    message = f"{full_key}={value}: {owner} has no key '{key}'{hint}"
    if not hint:
        message += f"\nits keys: {', '.join(keys)}"
        if free_form:  # a new key may be what was meant here
            message += f"\nto add '{key}' there: +{full_key}={value}"
    return message


def composition_message(error: ConfigCompositionException) -> str | None:
    """One message for a mistyped group option or key, or None for any other composition error."""
    if isinstance(error, MissingConfigException):
        return _missing_option(error)
    return _unknown_key(error)


@contextmanager
def readable_composition_errors() -> Iterator[None]:
    """While a console script runs Hydra: a mistyped setting stops it with `composition_message` alone on
    stderr and exit status 1. Hydra composes and reports inside `hydra._internal.utils.run_and_report`,
    before any callback or task of ours runs, so that reporter is wrapped for the duration (hydra-core is
    pinned in pyproject.toml; tests/test_typos.py runs the real scripts)."""
    from hydra._internal import utils as hydra_utils

    report = hydra_utils.run_and_report

    def run_and_report(func: Callable[[], Any]) -> Any:
        def composed() -> Any:
            try:
                return func()
            except ConfigCompositionException as error:
                message = composition_message(error)
                if message is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                sys.stderr.write(f"{message}\n")
                raise SystemExit(1) from None

        return report(composed)

    hydra_utils.run_and_report = run_and_report
    try:
        yield
    finally:
        hydra_utils.run_and_report = report
