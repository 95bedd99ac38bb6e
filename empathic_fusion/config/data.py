"""The `data` group: a multimodal dataset in the contract's layout (conf/data/demo.yaml,
empathic_stories.yaml) or a table of texts with numeric labels (text_csv.yaml, empathetic_exchanges.yaml).

Defaults live here; a dataset's YAML names its schema (`defaults: [schema_fusion_data, _self_]` or
`[schema_text_data, _self_]`) and sets only what is its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from omegaconf import II, MISSING

from empathic_fusion.config.checks import finite, one_of, require
from empathic_fusion.config.demo import DemoConfig
from empathic_fusion.dataset.scale import SELF_REPORT, RatingScale
from empathic_fusion.core.branches import MODALITIES

SCENARIOS = ("story_share", "reflection")
STALE_POLICIES = ("mask", "error")  # stored features that no longer match: mask them with a warning, or stop
LOADERS = ("batched", "reference")
FRAME_PLACES = ("auto", "memory", "disk")  # where the batched loader keeps its frame arrays
DEVICE_FRAME_DTYPES = ("bfloat16", "float16", "float32")  # frame arrays held in a GPU's memory, widened per batch


def _folds_rules(cv_folds: int, cv_fold: Optional[int]) -> dict[str, tuple[bool, str]]:
    in_range = cv_fold is None or cv_folds < 2 or cv_fold < cv_folds
    return {"cv_folds": (cv_folds == 0 or cv_folds >= 2, "0 (no cross-validation) or an integer >= 2"),
            "cv_fold": ((cv_fold is None or cv_fold >= 0) and in_range,
                        f"in 0..{cv_folds - 1} (data.cv_folds={cv_folds})" if cv_folds >= 2 else "an integer >= 0")}


@dataclass
class FusionDataConfig:
    """FusionDataModule (empathic_fusion/datamodules/fusion_datamodule.py): windows over sessions."""

    _target_: str = "empathic_fusion.datamodules.fusion_datamodule.FusionDataModule"
    name: str = "custom"
    dataset_dir: str = MISSING                   # the dataset in the documented layout (docs/dataset.md)
    store_dir: str = "${paths.data_dir}/features/${data.name}"
    scenario: str = "story_share"                # story_share | reflection
    window_frames: int = 120                     # k = 120 frames = 8 s at 15 fps (paper, section 3)
    stride_seconds: float = 1.0                  # windows slid every second
    split_fractions: Tuple[float, ...] = (0.7, 0.2, 0.1)  # participant-level train/val/test (Appendix B)
    split_seed: int = 0
    cv_folds: int = 0                            # K > 1: participant-grouped K-fold; sweep data.cv_fold=0,...,K-1
    cv_fold: int = 0                             # the fold that is the test split (val from the others)
    oversample: bool = True                      # balance rating classes on the training split only
    batch_size: int = 64
    num_workers: int = 0
    loader: str = "batched"                      # batched (whole batches from frame arrays) | reference (WindowDataset)
    frames: str = "auto"                         # batched loader's frame arrays: auto | memory | disk (out of core);
    #                                              auto = on a GPU's memory when they fit device_memory_gb, else disk
    device_memory_gb: Optional[float] = None     # frame arrays on the training GPU up to this size; null = half of
    #                                              the GPU's free memory when the run sets up
    device_frames_dtype: str = "bfloat16"        # their type in a GPU's memory (float32 on the host and on disk);
    #                                              batches are widened to float32 as they are gathered
    frame_cache_dir: Optional[str] = None        # the out-of-core frame cache (null: <store_dir>/frame_cache)
    normalize: Tuple[str, ...] = ("video", "audio")  # z-scored per feature with training-split statistics
    extract_workers: int = 2
    on_stale: str = "mask"                       # stale or damaged stored features: mask (warn) | error
    allow_shared_media: bool = False             # one media file (same sha256) in two participants' sessions:
    #                                              false = error (it leaks across splits), true = warning
    seed: int = II("seed")
    demo: Optional[DemoConfig] = None            # generate this demo dataset into dataset_dir first

    def __post_init__(self) -> None:
        fractions = self.split_fractions
        require("data", self, {
            "window_frames": (self.window_frames >= 1,
                              "an integer >= 1 (frames per window; the paper's 120 = 8 s at 15 fps)"),
            "stride_seconds": (finite(self.stride_seconds) and self.stride_seconds > 0,
                               "a number > 0 (seconds between window starts)"),
            "split_fractions": (len(fractions) == 3 and all(finite(f) and f >= 0 for f in fractions)
                                and abs(sum(fractions) - 1.0) <= 1e-6 and fractions[0] > 0,
                                "three non-negative fractions [train, val, test] summing to 1, train > 0"),
            "batch_size": (self.batch_size >= 1, "an integer >= 1"),
            "num_workers": (self.num_workers >= 0, "an integer >= 0"),
            "extract_workers": (self.extract_workers >= 1, "an integer >= 1"),
            "scenario": (self.scenario in SCENARIOS, one_of(SCENARIOS)),
            "on_stale": (self.on_stale in STALE_POLICIES, one_of(STALE_POLICIES)),
            "loader": (self.loader in LOADERS, one_of(LOADERS)),
            "frames": (self.frames in FRAME_PLACES, one_of(FRAME_PLACES)),
            "device_memory_gb": (self.device_memory_gb is None
                                 or (finite(self.device_memory_gb) and self.device_memory_gb >= 0), "null or a number >= 0"),
            "device_frames_dtype": (self.device_frames_dtype in DEVICE_FRAME_DTYPES, one_of(DEVICE_FRAME_DTYPES)),
            "normalize": (set(self.normalize) <= set(MODALITIES), f"a subset of {list(MODALITIES)}"),
            **_folds_rules(self.cv_folds, self.cv_fold)})


@dataclass
class TextDataConfig:
    """TextDataModule (empathic_fusion/datamodules/text_datamodule.py): one grouped cross-validation fold of a table."""

    _target_: str = "empathic_fusion.datamodules.text_datamodule.TextDataModule"
    name: str = "text"
    path: str = MISSING                          # CSV / TSV / JSONL
    text_columns: List[str] = MISSING            # the scored text first; more columns are encoded as further fields
    label_columns: List[str] = MISSING           # one model output per label; 2+ labels: their mean is "overall"
    group_column: Optional[str] = None           # writer / conversation: folds never split a group
    context_columns: List[str] = field(default_factory=list)  # e.g. the speaker turn a listener answers
    persona_columns: List[str] = field(default_factory=list)  # reader attributes (strings = categories)
    order_column: Optional[str] = None           # turn order inside a group (for context_turns)
    context_turns: int = 0                       # k > 0: the k preceding turns of the group become a field
    cv_folds: int = 5                            # grouped K-fold cross-validation
    cv_fold: Optional[int] = 0                   # the fold this run tests; null = train on every row, test nothing
    test_all: bool = False                       # test every row (evaluate.py test_csv=... sets it)
    val_fraction: float = 0.1                    # grouped share of each training fold held out to pick the best epoch
    batch_size: int = 64
    split_seed: int = 0
    levels: Optional[List[int]] = None           # [low, high] rating scale for Acc / F1 / QWK; null = inferred
    max_rows: Optional[int] = None               # seeded subsample of the table (null = every row)
    num_workers: int = 0
    generated: bool = False                      # a generated table (text/synthetic.py): the web app shows a demo banner
    source: Optional[str] = None                 # where the table comes from, named when data.path is missing

    def __post_init__(self) -> None:
        levels = self.levels
        require("data", self, {
            "text_columns": (len(self.text_columns) >= 1, "one or more column names"),
            "label_columns": (len(self.label_columns) >= 1, "one or more column names"),
            "context_turns": (self.context_turns >= 0, "an integer >= 0"),
            "val_fraction": (finite(self.val_fraction) and 0 <= self.val_fraction < 1, "a fraction in [0, 1)"),
            "batch_size": (self.batch_size >= 1, "an integer >= 1"),
            "num_workers": (self.num_workers >= 0, "an integer >= 0"),
            "levels": (levels is None or (len(levels) == 2 and levels[0] < levels[1]),
                       "null or [low, high] with low < high"),
            "max_rows": (self.max_rows is None or self.max_rows >= 1, "null or an integer >= 1"),
            **_folds_rules(self.cv_folds, self.cv_fold)})


def text_rating_scale(levels: Optional[List[int]]) -> RatingScale:
    """The rating scale a text table's threshold lives on: its own `levels`, else the 1-5 self-report scale."""
    return RatingScale(float(levels[0]), float(levels[-1])) if levels else SELF_REPORT
