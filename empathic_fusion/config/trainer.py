"""The `trainer` group: the arguments of lightning.pytorch.Trainer a config may set.

The project's own defaults are the first block; the other fields keep Lightning's defaults (a test
compares them with Trainer's signature), so `trainer.<argument>=...` works without a `+`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from empathic_fusion.config.checks import require


@dataclass
class TrainerConfig:
    _target_: str = "lightning.pytorch.Trainer"
    default_root_dir: Optional[str] = "${paths.output_dir}"
    max_epochs: int = 10                    # Appendix B
    devices: Any = 1                        # int, list of ids or "auto"
    log_every_n_steps: Optional[int] = 5
    deterministic: Any = False              # true | false | "warn"
    enable_model_summary: Optional[bool] = True
    enable_progress_bar: Optional[bool] = True
    # Lightning's defaults from here on
    accelerator: str = "auto"               # cpu | gpu | auto ...
    strategy: Any = "auto"                  # a name (ddp) or a strategy config with _target_
    num_nodes: int = 1
    precision: Optional[str] = None         # e.g. bf16-mixed, 16-mixed, 32
    sync_batchnorm: bool = False
    min_epochs: Optional[int] = None
    max_steps: int = -1
    max_time: Optional[str] = None          # "DD:HH:MM:SS"
    limit_train_batches: Optional[Union[int, float]] = None  # int: batches; float: fraction
    limit_val_batches: Optional[Union[int, float]] = None
    limit_test_batches: Optional[Union[int, float]] = None
    limit_predict_batches: Optional[Union[int, float]] = None
    overfit_batches: Union[int, float] = 0.0
    val_check_interval: Optional[Union[int, float]] = None
    check_val_every_n_epoch: Optional[int] = 1
    num_sanity_val_steps: Optional[int] = None
    accumulate_grad_batches: int = 1
    gradient_clip_val: Optional[Union[int, float]] = None
    gradient_clip_algorithm: Optional[str] = None
    benchmark: Optional[bool] = None
    enable_checkpointing: Optional[bool] = None
    fast_dev_run: Union[int, bool] = False
    reload_dataloaders_every_n_epochs: int = 0
    detect_anomaly: bool = False
    inference_mode: bool = True
    use_distributed_sampler: bool = True
    profiler: Optional[str] = None
    barebones: bool = False

    def __post_init__(self) -> None:
        require("trainer", self, {
            "max_epochs": (self.max_epochs >= 1, "an integer >= 1 (Lightning reads -1 as 'no limit')"),
            "min_epochs": (self.min_epochs is None or self.min_epochs >= 0, "an integer >= 0 or null"),
            "num_nodes": (self.num_nodes >= 1, "an integer >= 1"),
            "accumulate_grad_batches": (self.accumulate_grad_batches >= 1, "an integer >= 1")})
