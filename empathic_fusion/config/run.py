"""The top-level keys of each entry point's config: conf/train.yaml, evaluate.yaml, extract.yaml, serve.yaml,
predict.yaml.

Each YAML names its schema first in its defaults list (`defaults: [schema_train, _self_, ...]`). The config
groups (data, model, trainer, ...) keep their own schemas; here they are only declared (`Any`), so the
root admits them. A key a YAML or an override sets that is not here fails composition.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import II

from empathic_fusion.config.checks import one_of, require

SPLITS = ("test", "val")
ACCELERATORS = ("cpu", "gpu", "auto")
LOCK_MODES = ("wait", "fail")  # what an extraction does while another one writes its store
# the config groups a root config holds; each is checked by its own schema (validate.py)
GROUP_KEYS = ("paths", "data", "features", "model", "modality", "trainer", "logger", "callbacks", "evaluation",
              "judge")


@dataclass
class EntryPointConfig:
    """The keys every entry point has; each subclass adds its own keys and `rules()`."""

    task_name: str = ""
    threads: Optional[int] = None                # torch's CPU threads; null = the cores this process may use that are
    #                                              not busy now (OMP_NUM_THREADS wins when set)
    verbose: bool = False                        # true: show third-party log output (MediaPipe/TFLite C++ lines,
    #                                              Lightning's banners and tips) and an expected error's traceback
    paths: Any = None

    def rules(self) -> dict[str, tuple[bool, str]]:
        """The entry point's own value rules (key -> (ok, what is allowed))."""
        return {}

    def __post_init__(self) -> None:
        require("", self, {"threads": (self.threads is None or self.threads >= 1,
                                       "null (the cores free now) or an integer >= 1"), **self.rules()})


@dataclass
class GridConfig:
    """A grid sweep over models x modalities (conf/experiment/es_*.yaml)."""

    skip_incompatible: bool = False              # skip cells whose model needs a modality the cell lacks (skipped.json)
    share_setup: bool = True                     # a multirun's jobs in one process reuse the data's set-up when their
                                                 # data settings and files are the same (datamodules/setup_cache.py)


@dataclass
class TrainRunConfig(EntryPointConfig):
    """conf/train.yaml: train one model, then test its best checkpoint."""

    task_name: str = "train"
    seed: int = 42
    train: bool = True
    test: bool = True
    ckpt_path: Optional[str] = None              # a checkpoint to continue from; null/last: the run folder's last.ckpt
    optimized_metric: str = "val/loss"           # what train.py returns to a sweeper: a validation metric, never test
    tags: List[str] = field(default_factory=list)  # run tags for the loggers (experiments set them)
    grid: GridConfig = field(default_factory=GridConfig)
    data: Any = None
    features: Any = None
    model: Any = None
    modality: Any = None
    trainer: Any = None
    logger: Any = None
    callbacks: Any = None
    evaluation: Any = None

    def rules(self) -> dict[str, tuple[bool, str]]:
        return {"optimized_metric": (self.optimized_metric.startswith("val/"),
                                     "a validation metric (val/...); a sweeper never optimizes on test")}


@dataclass
class SweepTablesConfig:
    """Paper-style tables evaluate.py writes from a sweep directory."""

    metrics: List[str] = field(default_factory=lambda: ["pearson", "spearman", "accuracy", "f1", "mse"])  # + mae, ccc
    scale: float = 100                           # x100 as in the paper
    decimals: int = 1
    plots: bool = True                           # modality-ablation bar charts

    def __post_init__(self) -> None:
        require("tables", self, {
            "metrics": (bool(self.metrics), "one or more metric names (empathic_fusion/metrics.py)"),
            "decimals": (self.decimals >= 0, "an integer >= 0")})


@dataclass
class EvaluateRunConfig(EntryPointConfig):
    """conf/evaluate.yaml: one checkpoint, one sweep directory or an LLM judge (exactly one of the three)."""

    task_name: str = "evaluate"
    ckpt_path: Optional[str] = None              # one checkpoint (fusion or text) ...
    sweep_dir: Optional[str] = None              # ... or one sweep directory
    out_dir: Optional[str] = None                # the run's folder: its tables and plots (null = logs/evaluate/runs/<time>;
    #                                              with sweep_dir, its tables go into the sweep folder)
    split: str = "test"                          # test | val
    test_csv: Optional[str] = None               # text checkpoint: score every row of this table (same columns)
    tables: SweepTablesConfig = field(default_factory=SweepTablesConfig)
    data: Any = field(default_factory=dict)      # overrides of the checkpoint's data settings (data.<key>=...)
    features: Any = field(default_factory=dict)  # overrides of its feature settings
    logger: Any = None
    trainer: Any = None
    evaluation: Any = None
    judge: Any = None                            # judge=llm_judge: score an LLM judge (conf/judge)

    def rules(self) -> dict[str, tuple[bool, str]]:
        return {"split": (self.split in SPLITS, one_of(SPLITS))}


@dataclass
class ExtractRunConfig(EntryPointConfig):
    """conf/extract.yaml: fill the feature store without training."""

    task_name: str = "extract"
    seed: int = 42                               # only for the data config's interpolation; extraction is deterministic
    shard: Optional[str] = None                  # "i/n": sessions i, i+n, i+2n, ... in session-id order (0-based)
    shards: Optional[int] = None                 # with -m: one job per shard 0/N..N-1/N; with merge=true: merge N shards
    merge: bool = False                          # true: only join the shards' failure reports and hash caches
    #                                              (a sharded multirun does this when it ends)
    workers: int = II("data.extract_workers")    # worker processes for the video and audio branches
    branches: Optional[List[str]] = None         # e.g. [cnn] fills only these; null = the selected modalities' branches
    progress: bool = True
    verify: bool = False                         # true: also re-hash every stored array and look for NaN/Inf (reads
    #                                              the whole store); damaged branches are redone
    lock: str = "wait"                           # another extraction writes the store: wait for it to end, or fail
    #                                              at once with a message naming it (the shards of one run write together)
    lock_timeout: Optional[float] = None         # lock=wait: seconds to wait at most; null = until it ends
    data: Any = None
    features: Any = None
    modality: Any = None

    def rules(self) -> dict[str, tuple[bool, str]]:
        return {"workers": (self.workers >= 1, "an integer >= 1"),
                "shards": (self.shards is None or self.shards >= 1, "null or an integer >= 1 (the number of shards)"),
                "merge": (not (self.merge and self.shard), "false when shard is set (merge=true joins every shard)"),
                "lock": (self.lock in LOCK_MODES, one_of(LOCK_MODES)),
                "lock_timeout": (self.lock_timeout is None or self.lock_timeout >= 0,
                                 "null (wait until it ends) or a number of seconds >= 0")}


@dataclass
class ServeRunConfig(EntryPointConfig):
    """conf/serve.yaml: the Gradio app, a Text tab for a text model and a Clip tab for a fusion model."""

    task_name: str = "serve"
    ckpt_path: Optional[str] = None              # fusion checkpoint or run folder: the Clip tab
    text_ckpt_path: Optional[str] = None         # text checkpoint or run folder: the Text tab
    host: str = "127.0.0.1"                      # local only; no share link is ever made
    port: int = 7860
    max_upload_mb: int = 2048                    # uploads stream to disk and are refused past this size
    accelerator: str = "cpu"                     # where the predict loop runs the models: cpu | gpu | auto
    flag_csv: str = "${paths.log_dir}/serve/flagged.csv"  # Flag appends text, persona inputs and scores here

    def rules(self) -> dict[str, tuple[bool, str]]:
        return {"port": (0 < self.port < 65536, "a port number in 1..65535"),
                "max_upload_mb": (self.max_upload_mb >= 1, "an integer >= 1"),
                "accelerator": (self.accelerator in ACCELERATORS, one_of(ACCELERATORS))}


@dataclass
class PredictDataConfig:
    """What empathic-predict scores: a dataset folder (fusion checkpoint) or a table (text checkpoint)."""

    dataset_dir: Optional[str] = None            # fusion: a dataset in the contract's layout; ratings.csv optional
    store_dir: Optional[str] = None              # its feature store; null = <paths.data_dir>/features/predict/<folder
    #                                              name>-<hash of its path>, so a rerun reuses what was extracted
    path: Optional[str] = None                   # text: a CSV table with the checkpoint's text columns (labels optional)
    extract_workers: int = 1                     # worker processes for the video and audio branches
    batch_size: Optional[int] = None             # fusion: windows per forward pass; null = the checkpoint's

    def __post_init__(self) -> None:
        require("data", self, {
            "extract_workers": (self.extract_workers >= 1, "an integer >= 1"),
            "batch_size": (self.batch_size is None or self.batch_size >= 1, "null (the checkpoint's) or an integer >= 1")})


@dataclass
class PredictRunConfig(EntryPointConfig):
    """conf/predict.yaml: score new recordings (fusion checkpoint) or a new text table (text checkpoint)."""

    task_name: str = "predict"
    ckpt_path: Optional[str] = None              # a checkpoint file or a run folder (its best checkpoint); required
    out_dir: Optional[str] = None                # where the predictions go; null = this run's output folder
    accelerator: str = "cpu"                     # where the predict loop runs the model: cpu | gpu | auto
    progress: bool = True                        # progress bars for extraction and prediction
    data: PredictDataConfig = field(default_factory=PredictDataConfig)

    def rules(self) -> dict[str, tuple[bool, str]]:
        return {"ckpt_path": (bool(self.ckpt_path), "a checkpoint file or a run folder"),
                "accelerator": (self.accelerator in ACCELERATORS, one_of(ACCELERATORS))}


RUN_SCHEMAS = {"train": TrainRunConfig, "evaluate": EvaluateRunConfig, "extract": ExtractRunConfig,
               "serve": ServeRunConfig, "predict": PredictRunConfig}
