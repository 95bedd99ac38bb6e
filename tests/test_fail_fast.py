"""A run whose inputs are not there fails at once and leaves nothing: a missing checkpoint or dataset folder
is reported before torch or lightning is imported and before Hydra makes the run (or sweep) folder, and no
feature store is created; predict's out_dir= is its run folder, not a second one under logs/. Also: the
scoring tables raise no warning about a read-only NumPy array."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from empathic_fusion.config.inputs import input_problems
from empathic_fusion.utils import PROJECT_ROOT
from empathic_fusion.compose import compose_config

FORMAT2 = Path(__file__).parent / "data" / "format2"
HEAVY = re.compile(r"\|\s+(torch|lightning)$", re.MULTILINE)  # -X importtime: a top-level import of either


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """A console script with every default folder (logs/, data/) under `cwd`, its imports listed on stderr."""
    environment = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    environment.update(PYTHONPATH=str(PROJECT_ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-X", "importtime", str(PROJECT_ROOT / args[0]), *args[1:],
                           f"paths.root_dir={cwd}"], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=120)


def _message(done: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))


@pytest.mark.parametrize("script, data", [("predict.py", "data.path=new.csv"), ("evaluate.py", None)])
def test_a_missing_checkpoint_is_reported_before_torch_and_leaves_no_run_folder(script, data, tmp_path):
    (tmp_path / "new.csv").write_text("text\nhello\n")
    missing = tmp_path / "gone" / "best.ckpt"
    done = _run([script, f"ckpt_path={missing}", *([data] if data else [])], tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert _message(done) == f"ckpt_path={missing}: no such checkpoint file or run folder"
    assert not HEAVY.search(done.stderr), "torch or lightning was imported before the check"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.csv"]  # no logs/<task>/runs/<date>


@pytest.mark.parametrize("args", [
    ["predict.py", f"ckpt_path={FORMAT2 / 'fusion_lf_lstm.ckpt'}", "data.dataset_dir=missing"],
    ["train.py", "data.dataset_dir=missing", "data.demo=null"],
    ["train.py", "-m", "data.dataset_dir=missing", "data.demo=null", "seed=1,2"],  # no sweep folder either
    ["extract.py", "data.dataset_dir=missing", "data.demo=null"],
])
def test_a_missing_dataset_folder_creates_no_run_or_store_folder(args, tmp_path):
    done = _run(args, tmp_path)
    assert done.returncode == 1 and _message(done) == "data.dataset_dir=missing: no such folder"
    assert not HEAVY.search(done.stderr)
    assert list(tmp_path.iterdir()) == []  # neither logs/ nor data/features/...


def test_a_shipped_recipe_whose_data_is_missing_says_which_setting_to_give_and_where_the_data_is(tmp_path):
    """experiment=text_empathetic_exchanges from a folder without ../shared/data (as in an installed copy,
    where the paths root is the working directory): the one input message names data.path= and where
    EmpatheticExchanges comes from (the data config's `source`), and so does the table reader."""
    from empathic_fusion.core.errors import MissingFileError
    from empathic_fusion.datamodules.text_table import read_table

    done = _run(["train.py", "experiment=text_empathetic_exchanges"], tmp_path)
    table = tmp_path / ".." / "shared" / "data" / "empathetic_exchanges" / "EmpatheticExchanges_5ES.csv"
    assert done.returncode == 1 and list(tmp_path.iterdir()) == []  # no run folder
    message = _message(done)
    source = compose_config(["experiment=text_empathetic_exchanges"], tmp_path).data.source
    assert message == f"data.path={table}: no such file; give data.path=<your copy>; where the data comes from: {source}"
    assert "github.com/Dregdael/EmpatheticeExchanges-dataset" in source and "docs/text_models.md" in source
    with pytest.raises(MissingFileError, match=r"does not exist; give data.path=<your copy>; where the data comes "
                                               r"from: EmpatheticExchanges_5ES.csv of EmpatheticExchanges"):
        read_table(table, source)


def test_each_input_problem_is_named_and_what_is_not_an_input_is_skipped(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "table.csv").write_text("text\nhello\n")
    cfg = compose_config([f"ckpt_path={tmp_path / 'run'}", f"data.path={tmp_path}",
                          f"data.dataset_dir={tmp_path / 'x'}"], tmp_path, "predict")
    assert input_problems(cfg) == [
        f"ckpt_path={tmp_path / 'run'}: no .ckpt file in {tmp_path / 'run'} (train.py writes "
        "<run folder>/checkpoints/*.ckpt)",
        f"data.dataset_dir={tmp_path / 'x'}: no such folder", f"data.path={tmp_path}: is a folder; give a file"]
    (tmp_path / "run" / "checkpoints").mkdir()
    (tmp_path / "run" / "checkpoints" / "epoch_000.ckpt").write_bytes(b"")
    cfg = compose_config([f"ckpt_path={tmp_path / 'run'}", f"data.path={tmp_path / 'table.csv'}"], tmp_path, "predict")
    assert input_problems(cfg) == []
    # the demo dataset is generated where it is missing; ckpt_path=last is the run folder's last.ckpt
    assert input_problems(compose_config([f"data.dataset_dir={tmp_path / 'new'}", "ckpt_path=last"], tmp_path)) == []
    # in a multirun, a setting the sweep varies is left to each job
    cfg = compose_config(["data.dataset_dir=missing", "data.demo=null"], tmp_path)
    assert input_problems(cfg, ["data.dataset_dir"]) == input_problems(cfg, ["data"]) == []
    assert input_problems(cfg, ["seed"]) == ["data.dataset_dir=missing: no such folder"]


@pytest.mark.parametrize("task,extra", [("predict", []), ("evaluate", ["sweep_dir=/x/sweep"])])
def test_out_dir_is_the_run_folder(task, extra, tmp_path):
    """predict's and evaluate's out_dir= is the run's folder: no second, empty one under logs/<task>/runs/."""
    cfg = compose_config([f"out_dir={tmp_path / 'out'}", *extra], tmp_path, task)
    assert cfg.hydra.run.dir == str(tmp_path / "out")
    default = compose_config(extra, tmp_path, task).hydra.run.dir
    assert re.fullmatch(re.escape(f"{PROJECT_ROOT}/logs/{task}/runs/") + r"[\d_-]+", default)


def test_averaging_windows_per_rating_raises_no_warning_about_read_only_arrays():
    from empathic_fusion.scoring.fusion import rating_means

    windows = pd.DataFrame({"rating_index": [3, 3, 7], "start": [0, 15, 0]})
    index = windows.rating_index.to_numpy(dtype=np.int64)  # as _tables reads it: read-only (copy-on-write)
    pred = np.array([1.0, 0.0, 0.5], dtype=np.float32)
    pred.setflags(write=False)
    assert not index.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        means, ids = rating_means(pred, index)
    assert ids.tolist() == [3, 7] and means.tolist() == pytest.approx([0.5, 0.5])


def test_the_sweep_tables_callback_loads_without_torch():
    """Hydra instantiates the experiments' paper_tables callback before the input check runs: with torch and
    Lightning behind it (through the metrics and the missing-modality report), a missing data.path in such an
    experiment took about 8 s to report; without them, about 2.5 s."""
    code = ("import sys; import empathic_fusion.evaluation.sweep; "
            "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
