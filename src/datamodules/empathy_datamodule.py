"""One LightningDataModule for any dataset in the contract's layout (the demo included).

prepare_data: (demo only) generate the dataset, validate it, bring the feature store up to date
for the selected modalities. setup: windows per rating, the persisted participant split,
normalisation statistics from the training split, and the three window datasets.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from torch.utils.data import DataLoader

from src.dataset import TRAIT_COLUMNS, EmpathyDataset, load_dataset
from src.datamodules.sampler import RatingOversampler
from src.datamodules.splits import load_or_create_split
from src.datamodules.window_dataset import BRANCH, WindowDataset
from src.datamodules.windows import build_windows
from src.features.extract import extract_features
from src.features.store import DATASET_KEY, FeatureStore

log = logging.getLogger(__name__)


def speaking_frames(transcript, n_frames: int, fps: float) -> np.ndarray:
    """Frames whose centre falls inside a participant utterance."""
    centres = (np.arange(n_frames) + 0.5) / fps
    mask = np.zeros(n_frames, dtype=bool)
    for row in transcript[transcript.speaker == "participant"].itertuples():
        mask |= (centres >= row.start) & (centres < row.end)
    return mask


class EmpathyDataModule(L.LightningDataModule):
    def __init__(self, dataset_dir: str, store_dir: str, modalities: list[str], features: dict[str, Any],
                 name: str = "custom", scenario: str = "story_share", window_frames: int = 120,
                 stride_seconds: float = 1.0, split_fractions: tuple[float, float, float] = (0.7, 0.2, 0.1),
                 split_seed: int = 0, oversample: bool = True, batch_size: int = 64, num_workers: int = 0,
                 normalize: tuple[str, ...] = ("video", "audio"), demo: dict[str, Any] | None = None,
                 extract_workers: int = 2, seed: int = 0):
        super().__init__()
        unknown = set(modalities) - set(BRANCH)
        if not modalities or unknown:
            raise ValueError(f"modalities must be a non-empty subset of {list(BRANCH)}, got {modalities}")
        self.dataset_dir = Path(dataset_dir)
        self.store_dir = Path(store_dir)
        self.modalities = list(modalities)
        self.features = features
        self.name = name
        self.scenario = scenario
        self.window_frames = int(window_frames)
        self.stride_seconds = float(stride_seconds)
        self.split_fractions = tuple(split_fractions)
        self.split_seed = int(split_seed)
        self.oversample = oversample
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.normalize = [m for m in normalize if m in self.modalities]
        self.demo = dict(demo) if demo else None
        self.extract_workers = int(extract_workers)
        self.seed = int(seed)
        self.datasets: dict[str, WindowDataset] = {}
        self.warnings: list[str] = []
        self._prepared = False

    # ---- preparation -------------------------------------------------------------------------
    def prepare_data(self) -> None:
        if self._prepared:  # Lightning calls this again in fit/test; once per process is enough
            return
        if self.demo is not None:
            from src.demo.generate import DemoConfig, generate_demo

            generate_demo(self.dataset_dir, DemoConfig(**self.demo), workers=self.extract_workers)
        dataset = load_dataset(self.dataset_dir)
        for warning in dataset.warnings:
            log.warning(warning)
        report = extract_features(dataset, FeatureStore(self.store_dir), self.modalities, self.features,
                                  workers=self.extract_workers)
        log.info(report.summary())
        self._prepared = True

    # ---- setup ---------------------------------------------------------------------------------
    def _session_frames(self, dataset: EmpathyDataset, store: FeatureStore) -> tuple[dict[str, int], set]:
        frames, missing = {}, set()
        for sid in dataset.sessions.index:
            if sid not in dataset.transcripts:
                continue
            lengths = []
            for modality in self.modalities:
                entry = store.entry(sid, BRANCH[modality])
                if entry is None:
                    missing.add((sid, modality))
                    self.warnings.append(f"session '{sid}': no {BRANCH[modality]} features in the store "
                                         f"(see {store.root / 'failures.json'}); {modality} is masked for it")
                else:
                    lengths.append(int(entry["n_frames"]))
            if lengths:
                frames[sid] = max(lengths)
            else:
                self.warnings.append(f"session '{sid}': none of {self.modalities} was extracted; its ratings are skipped")
        return frames, missing

    def _stats(self, windows, speaking, missing, store: FeatureStore) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per-feature mean and std over the valid frames that training windows cover."""
        stats = {}
        for modality in self.normalize:
            total = total_sq = None
            count = 0
            for sid, group in windows.groupby("session_id"):
                if (sid, modality) in missing:
                    continue
                features = store.load(sid, BRANCH[modality], "features")
                covered = np.zeros(len(features), dtype=bool)
                for start in group.start:
                    covered[max(start, 0): start + self.window_frames] = True
                covered &= store.load(sid, BRANCH[modality], "mask") > 0
                if modality == "audio":
                    covered &= speaking[sid][: len(covered)]
                values = np.asarray(features[covered], dtype=np.float64)
                total = values.sum(0) if total is None else total + values.sum(0)
                total_sq = (values ** 2).sum(0) if total_sq is None else total_sq + (values ** 2).sum(0)
                count += len(values)
            if not count:
                continue
            mean = total / count
            std = np.sqrt(np.maximum(total_sq / count - mean ** 2, 0.0))
            stats[modality] = (mean.astype(np.float32), np.where(std < 1e-6, 1.0, std).astype(np.float32))
        return stats

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        dataset = load_dataset(self.dataset_dir)
        self.warnings = list(dataset.warnings)
        store = FeatureStore(self.store_dir)
        stories = store.entry(DATASET_KEY, "stories")
        if stories is None:
            raise RuntimeError(f"feature store {self.store_dir} has no story embeddings; run prepare_data/extract first")
        session_frames, missing = self._session_frames(dataset, store)
        speaking = {sid: speaking_frames(dataset.transcripts[sid], n, dataset.fps) for sid, n in session_frames.items()}
        windows, notes = build_windows(dataset.ratings, dataset.transcripts, session_frames, self.scenario,
                                       dataset.fps, self.window_frames, self.stride_seconds)
        self.warnings += notes
        if windows.empty:
            raise RuntimeError(f"no {self.scenario} windows in {self.dataset_dir}; warnings: {self.warnings}")
        assignment, self.split_hash = load_or_create_split(
            self.store_dir / "splits" / f"seed{self.split_seed}_{'-'.join(map(str, self.split_fractions))}.json",
            dataset.participants.index.tolist(), self.split_fractions, self.split_seed)
        participant = dataset.ratings.participant_id.loc[windows.rating_index].to_numpy()
        windows["split"] = [assignment[p] for p in participant]
        self.windows = windows
        self.ratings = dataset.ratings
        train_windows = windows[windows.split == "train"]
        self.stats = self._stats(train_windows, speaking, missing, store)
        story_ids = stories["story_ids"]
        story_embeddings = np.asarray(store.load(DATASET_KEY, "stories", "embeddings"), dtype=np.float32)
        story_rows = {s: i for i, s in enumerate(story_ids)}
        self.input_dims = {m: self._dim(store, m, session_frames) for m in self.modalities}
        self.input_dims.update(story=int(story_embeddings.shape[1]), traits=len(TRAIT_COLUMNS))
        for split in ("train", "val", "test"):
            self.datasets[split] = WindowDataset(
                store, windows[windows.split == split], dataset.ratings, self.modalities, self.window_frames,
                session_frames, speaking, story_embeddings, story_rows, dataset.participants[list(TRAIT_COLUMNS)],
                self.stats, missing, self.input_dims)
        self.train_target_mean = float(self.datasets["train"].targets.mean()) if len(train_windows) else 0.0
        self.manifest_hash = store.manifest_hash(sorted(session_frames), [BRANCH[m] for m in self.modalities])
        for warning in self.warnings:
            log.warning(warning)
        log.info("windows: %s (split %s)", {s: len(d) for s, d in self.datasets.items()}, self.split_hash)

    def _dim(self, store: FeatureStore, modality: str, session_frames: dict[str, int]) -> int:
        name = "utterances" if modality == "text" else "features"
        for sid in session_frames:
            entry = store.entry(sid, BRANCH[modality])
            if entry is not None:
                return int(entry["arrays"][name]["shape"][1])
        raise RuntimeError(f"no session has {modality} features in {store.root}")

    def describe(self) -> dict[str, Any]:
        """What a checkpoint records about the data it was trained on."""
        return {"dataset": self.name, "scenario": self.scenario, "modalities": self.modalities,
                "input_dims": self.input_dims, "window_frames": self.window_frames, "split_hash": self.split_hash,
                "feature_manifest_hash": self.manifest_hash,
                "windows": {s: len(d) for s, d in self.datasets.items()}}

    # ---- loaders -------------------------------------------------------------------------------
    def _loader(self, split: str, **kwargs) -> DataLoader:
        return DataLoader(self.datasets[split], batch_size=self.batch_size, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, **kwargs)

    def train_dataloader(self) -> DataLoader:
        data = self.datasets["train"]
        if self.oversample:
            classes = np.round(data.ratings).astype(int)
            return self._loader("train", sampler=RatingOversampler(classes, seed=self.seed))
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
