"""The test report of a tested module, by what the module is: the pipeline (train.py after testing,
evaluate.py on a checkpoint) calls `module_report` with the module and its datamodule, so modules only
learn and log."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from empathic_fusion.evaluation.fusion_report import fusion_report
from empathic_fusion.evaluation.text_report import text_report
from empathic_fusion.models.base import EmpathyLightningModule

REPORTS: dict[str, Callable[..., dict[str, Any]]] = {"fusion": fusion_report, "text": text_report}


def module_report(module: EmpathyLightningModule, datamodule: Any, out_dir: Path, evaluation: dict[str, Any],
                loggers: list | tuple = ()) -> dict[str, Any]:
    """Write the report of the module's last `trainer.test` under `out_dir` and return its summary."""
    write = REPORTS.get(module.kind)
    if write is None:
        raise ValueError(f"no test report for a '{module.kind}' module; reports exist for {sorted(REPORTS)}")
    return write(module, datamodule, out_dir, evaluation, loggers)
