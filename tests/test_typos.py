"""A mistyped setting is one message with a "did you mean", exit status 1 and no traceback: a group option
(`model=tfm`) lists the group's options without the schemas registered there (`schema_*`) and without Hydra's
search path; a key (`data.dataset_dr=x`) names the closest keys and never advises `+key=` where a schema
holds the keys. Nothing is written: composition fails before Hydra makes a run folder."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from empathic_fusion.config.typos import composition_message
from empathic_fusion.utils import PROJECT_ROOT
from empathic_fusion.compose import compose_config


def _message(overrides: list[str], tmp_path: Path, config: str = "train") -> str | None:
    with pytest.raises(ConfigCompositionException) as error:
        compose_config(overrides, tmp_path, config)
    return composition_message(error.value)


@pytest.mark.parametrize("override, expected", [
    ("model=tfm", "model=tfm: 'tfm' is not an option of the config group 'model'; did you mean model=tfn?\n"
                  "the options: amer, ef_lstm, lf_lstm, mean, story_similarity, text_finetune, text_regressor, tfn"),
    ("data.dataset_dr=x", "data.dataset_dr=x: data (FusionDataConfig) has no key 'dataset_dr'; "
                          "did you mean data.dataset_dir=x?"),
    ("seeed=1", "seeed=1: the config (TrainRunConfig) has no key 'seeed'; did you mean seed=1?"),
    ("hydra/launcher=sharedd", "hydra/launcher=sharedd: 'sharedd' is not an option of the config group "
                               "'hydra/launcher'; did you mean hydra/launcher=shared_device?\nthe options: basic, "
                               "extract_slurm, joblib, shared_device, submitit_local, submitit_slurm"),
])
def test_a_typo_gets_the_closest_option_or_key(override, expected, tmp_path):
    assert _message([override], tmp_path) == expected


def test_without_a_close_key_the_keys_are_listed_and_plus_only_where_no_schema_holds_them(tmp_path):
    typed = _message(["data.zzzq=1"], tmp_path)
    assert typed.startswith("data.zzzq=1: data (FusionDataConfig) has no key 'zzzq'\nits keys: _target_, name, "
                            "dataset_dir,")
    assert "+" not in typed  # the schema would refuse +data.zzzq=1 as well
    free_form = _message(["model.net.zzzq=1"], tmp_path)  # a network's own arguments: any key may be meant
    assert free_form.endswith("to add 'zzzq' there: +model.net.zzzq=1")


def test_other_composition_errors_keep_hydras_message(tmp_path):
    assert _message(["data.batch_size=abc"], tmp_path) is None  # a wrong type: OmegaConf's message says it


def _environment(**extra: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return {**environment, "PYTHONPATH": str(PROJECT_ROOT), **extra}


@pytest.mark.parametrize("override, expected", [
    ("model=tfm", "did you mean model=tfn?"),
    ("data.dataset_dr=x", "data.dataset_dr=x: data (FusionDataConfig) has no key 'dataset_dr'; "
                          "did you mean data.dataset_dir=x?"),
])
def test_train_py_prints_the_message_alone(override, expected, tmp_path):
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "train.py"), override,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=_environment(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert expected in done.stderr and len(done.stderr.strip().splitlines()) <= 2, done.stderr
    for noise in ("Traceback", "schema_", "Config search path", "HYDRA_FULL_ERROR", f"+{override}"):
        assert noise not in done.stderr
    assert not (tmp_path / "run").exists()


def test_hydra_full_error_keeps_hydras_traceback(tmp_path):
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "train.py"), "model=tfm",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=_environment(HYDRA_FULL_ERROR="1"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" in done.stderr and "MissingConfigException" in done.stderr
