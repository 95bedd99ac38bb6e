"""Every entry point ends with a "What now:" block, the last thing it prints: the run folder, the
checkpoint to pass as ckpt_path= (train), the results table and the plots that exist
(test_predicted_vs_true.png first), the next command (train), and where predictions.csv went (predict).
The console scripts run in process on the smallest text model (a 16-row synthetic table, two epochs)."""
from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from empathic_fusion.cli import evaluate, predict, train
from empathic_fusion.compose import compose_config
from empathic_fusion.utils.run_output import PLOT_FIRST, plots, shown, what_now

FORMAT2 = Path(__file__).parent / "data" / "format2"


def _block(stdout: str) -> dict[str, str]:
    """The last block of the output, as {row name: value}; it must end the output."""
    lines = stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line == "What now:")
    rows = {}
    for line in lines[start + 1:]:
        assert line.startswith("  "), f"the block is not the last thing printed: {line!r}"
        name, value = line.strip().split("  ", 1)
        rows[name] = value.strip()
    return rows


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, str]:
    """train.py on the smallest text model, its run folder and what it printed."""
    from empathic_fusion.demo.generated_table import make_text_table

    root = tmp_path_factory.mktemp("next_steps")
    make_text_table(16, 2, seed=0).to_csv(root / "table.csv", index=False)
    out, printed = root / "run", io.StringIO()
    with redirect_stdout(printed):
        train(compose_config(["data=text_csv", "model=text_regressor", "modality=t", f"data.path={root / 'table.csv'}",
                              "data.text_columns=[text]", "data.label_columns=[emotional]", "data.group_column=writer",
                              "data.cv_folds=2", "model.net.encoder.cache_dir=null", "model.baselines.enabled=false",
                              "trainer.max_epochs=2", "trainer.enable_progress_bar=false",
                              "trainer.enable_model_summary=false", "logger=none", "evaluation.bootstrap=0"], out))
    return out, printed.getvalue()


def test_train_names_its_folder_checkpoint_table_plots_and_the_predict_command(trained):
    out, printed = trained
    block = _block(printed)
    assert block["run folder"] == shown(out)
    checkpoint = Path(block["checkpoint"].split("  ")[0])
    assert checkpoint.is_file() and checkpoint.parent == out / "checkpoints" and checkpoint.suffix == ".ckpt"
    assert block["results"] == shown(out / "test_metrics.md") and (out / "test_metrics.md").is_file()
    written = [p.name for p in plots(out)]
    assert written[0] == PLOT_FIRST and block["plots"] == ", ".join(written)
    assert block["next"] == f"empathic-predict ckpt_path={shown(out)} data.path=<table of new texts>"


def test_evaluate_names_its_folder_table_and_plots(trained, tmp_path, capsys):
    checkpoint = next((trained[0] / "checkpoints").glob("epoch_*.ckpt"))
    out = tmp_path / "evaluate"
    evaluate(compose_config([f"ckpt_path={checkpoint}", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false",
                             "evaluation.bootstrap=0"], out, "evaluate"))
    block = _block(capsys.readouterr().out)
    assert block["run folder"] == shown(out)
    assert block["results"] == shown(out / "test_metrics.md") and (out / "test_metrics.md").is_file()
    assert block["plots"].split(", ")[0] == PLOT_FIRST
    assert all((out / name).is_file() for name in block["plots"].split(", "))


def test_predict_names_where_predictions_csv_went(tmp_path, capsys):
    (tmp_path / "new.csv").write_text("id,text\na,I am so sorry to hear that.\nb,It rained all day.\n")
    out = tmp_path / "out"
    predict(compose_config([f"ckpt_path={FORMAT2 / 'text_regressor.ckpt'}", f"data.path={tmp_path / 'new.csv'}",
                            f"out_dir={out}", "progress=false"], tmp_path / "run", "predict"))
    block = _block(capsys.readouterr().out)
    assert block["run folder"] == shown(out)
    assert block["predictions"] == f"{shown(out / 'predictions.csv')}  (2 scored, 0 not scored)"
    assert (out / "predictions.csv").is_file() and block["also"] == "model_card.md"


def test_a_row_without_a_value_is_left_out():
    assert what_now([("run folder", "logs/x"), ("checkpoint", None), ("next", "empathic-evaluate sweep_dir=x")]) == (
        "\nWhat now:\n  run folder  logs/x\n  next        empathic-evaluate sweep_dir=x")
