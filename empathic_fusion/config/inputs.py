"""The files and folders a run's settings name, checked before torch is imported or anything is written.

The console scripts check them from a Hydra callback (empathic_fusion/cli.py `InputCheck`) once the config
is composed, before Hydra makes the run's folder and before torch is imported: a checkpoint, dataset folder
or table that is not there ends the run within a second or two, naming each setting, and leaves no run,
sweep or store folder behind. Only this module's cheap `pathlib` checks run here; what a file holds is
checked by the code that reads it. In a multirun a setting that the sweep varies is left to each job.
A recipe whose data lives outside the package (experiment=text_empathetic_exchanges) says where it comes
from in its data config (`data.source`); a missing data file or folder then names the setting to give and
that source (`missing_data_hint`, which the text table reader uses too).
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

FILE, FOLDER, CHECKPOINT = "file", "folder", "checkpoint"
# per entry point (task_name): setting -> what it must name
CHECKED: dict[str, dict[str, str]] = {
    "train": {"ckpt_path": FILE, "data.dataset_dir": FOLDER, "data.path": FILE},
    "evaluate": {"ckpt_path": CHECKPOINT, "sweep_dir": FOLDER, "test_csv": FILE, "data.dataset_dir": FOLDER,
                 "data.path": FILE},
    "predict": {"ckpt_path": CHECKPOINT, "data.dataset_dir": FOLDER, "data.path": FILE},
    "extract": {"data.dataset_dir": FOLDER},
    "serve": {"ckpt_path": CHECKPOINT, "text_ckpt_path": CHECKPOINT},
}
DATA_KEYS = ("data.path", "data.dataset_dir")  # settings naming the data; their problems get `missing_data_hint`
_ABSENT = object()


def missing_data_hint(key: str, source: str | None) -> str:
    """What to do about data a setting names that is not there, appended to the problem: which setting to
    give and, when the data config says (`data.source`), where the data can be found."""
    return f"; give {key}=<your copy>" + (f"; where the data comes from: {source}" if source else "")


def _value(cfg: DictConfig, key: str) -> Any:
    """The setting's resolved value; None when unset, missing (???) or not resolvable yet (the task reports it)."""
    return OmegaConf.select(cfg, key, default=None, throw_on_missing=False, throw_on_resolution_failure=False)


def _skipped(cfg: DictConfig, key: str) -> bool:
    """Settings that name no input: train's `ckpt_path=last`, a demo dataset generated into `dataset_dir`
    when it is not there yet, the dataset of `extract.py merge=true` (which reads only the store)."""
    if key == "ckpt_path" and cfg.get("task_name") == "train":
        return _value(cfg, key) == "last"
    if key == "data.dataset_dir":
        return _value(cfg, "data.demo") is not None or bool(cfg.get("merge", False))
    return False


def problem(key: str, value: Any, kind: str) -> str | None:
    """What is wrong with `key=value` naming a `kind` of input (a file, a folder, a checkpoint file or run
    folder), as one line; None when it is there and readable."""
    path = Path(str(value)).expanduser()
    setting = f"{key}={value}"
    if kind == CHECKPOINT:
        if not path.exists():
            return f"{setting}: no such checkpoint file or run folder"
        if path.is_dir():
            folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
            if not os.access(folder, os.R_OK | os.X_OK):
                return f"{setting}: the folder {folder} cannot be read (permissions)"
            if not any(folder.glob("*.ckpt")):
                return f"{setting}: no .ckpt file in {folder} (train.py writes <run folder>/checkpoints/*.ckpt)"
            return None
        kind = FILE
    if kind == FILE:
        if path.is_dir():
            return f"{setting}: is a folder; give a file"
        if not path.is_file():
            return f"{setting}: no such file"
        if not os.access(path, os.R_OK):
            return f"{setting}: the file cannot be read (permissions)"
        return None
    if not path.is_dir():
        return f"{setting}: {'is a file; give a folder' if path.exists() else 'no such folder'}"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"{setting}: the folder cannot be read (permissions)"
    return None


def swept_keys(cfg: DictConfig) -> set[str]:
    """The settings a multirun varies: its sweep overrides (`data.cv_fold=0,1,2`) and its sweeper's
    parameters (hparams_search=optuna)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    task = OmegaConf.to_container(cfg.hydra.overrides.task, resolve=False) if "hydra" in cfg else []
    keys = {o.key_or_group for o in OverridesParser.create().parse_overrides(list(task))
            if o.is_sweep_override()}
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None)
    return keys | set(params.keys() if isinstance(params, DictConfig) else ())


def _varied(cfg: DictConfig, key: str, swept: Iterable[str]) -> bool:
    """Whether a sweep may change `key`: it is swept, or a group above it is (data=a,b), or a global group
    is (experiment=a,b, which may set anything)."""
    for name in swept:
        if key == name or key.startswith(f"{name}.") or OmegaConf.select(cfg, name, default=_ABSENT) is _ABSENT:
            return True
    return False


def input_problems(cfg: DictConfig, swept: Iterable[str] = ()) -> list[str]:
    """One line per setting of this entry point (cfg.task_name) that names an input that is not there or
    cannot be read; settings in `swept` (a multirun's) are left to each job."""
    swept = list(swept)
    problems = []
    for key, kind in CHECKED.get(str(cfg.get("task_name", "")), {}).items():
        value = _value(cfg, key)
        if value in (None, "") or _skipped(cfg, key) or _varied(cfg, key, swept):
            continue
        if (found := problem(key, value, kind)) is not None:
            source = _value(cfg, "data.source") if key in DATA_KEYS else None
            problems.append(found + (missing_data_hint(key, source) if source else ""))
    return problems
