"""One LightningDataModule for any dataset in the contract's layout (the demo included).

prepare_data: (demo only) generate the dataset, validate it, bring the feature store up to date
for the selected modalities. setup: windows per rating, the persisted participant split,
normalisation statistics from the training split, and the three window datasets. With
`predict=True` there is no split: setup builds one `predict` split over every (session, story) of
the dataset (ratings.csv's pairs; a session without ratings is scored against every story),
z-scored with the given `stats` (a checkpoint's training statistics); the app scores an uploaded
clip this way (empathic_fusion/app/clip.py), through empathic_fusion/models/predict.py. Loaders
(`loader: batched`, the default) gather whole batches from frame arrays concatenated across sessions
(empathic_fusion/datamodules/window_gather.py): `frames: auto` keeps them in a GPU's memory (in
`device_frames_dtype`) when they fit `device_memory_gb` (by default half of its free memory) and otherwise
reads them out of core from a normalised frame cache on disk
(frame_cache.py), so a run's memory does not grow with the corpus; `loader: reference` is the
per-window `WindowDataset` the batched loader is proven equal to.
"""
from __future__ import annotations

import logging
from pathlib import Path
from collections.abc import Callable
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, DistributedSampler

from empathic_fusion.config import modality_branches, with_defaults
from empathic_fusion.config.data import FusionDataConfig
from empathic_fusion.dataset import TRAIT_COLUMNS, EmpathyDataset, load_dataset
from empathic_fusion.dataset.scale import SELF_REPORT, RatingScale
from empathic_fusion.datamodules import setup_cache
from empathic_fusion.datamodules.frame_cache import frame_arrays_on_disk
from empathic_fusion.datamodules.sampler import RatingOversampler, ResumableLoader, _world, shuffled_windows
from empathic_fusion.datamodules.statistics import normalisation_stats
from empathic_fusion.datamodules.splits import (TooFewParticipantsError, check_participants, load_or_create_split,
                                               participant_folds)
from empathic_fusion.datamodules.window_dataset import FrameSource, WindowDataset
from empathic_fusion.datamodules.window_gather import (FrameArrays, FrameLayout, IndexBatchSampler, WindowBatches,
                                                       WindowPositions)
from empathic_fusion.datamodules.windows import build_windows, rating_frames
from empathic_fusion.core.branches import BRANCHES, INDEXED, MODALITIES, branch_width, speech_branch
from empathic_fusion.features.extract import extract_features, stored_warnings
from empathic_fusion.features.freshness import StaleFeaturesError, branch_problem
from empathic_fusion.features.speech import speech_mask
from empathic_fusion.core.files import canonical_hash
from empathic_fusion.core.registry import register_model
from empathic_fusion.features.store import DATASET_KEY, FeatureStore
from empathic_fusion.utils.job_timings import timed
from empathic_fusion.utils.run_output import warn_data

log = logging.getLogger(__name__)


_D = FusionDataConfig  # every default of the data group lives in its schema (empathic_fusion/config/data.py)
# what prepare_data and setup leave behind, which the next job of a sweep on the same data reuses (setup_cache.py)
_SET_UP = ("extraction_report", "dataset", "rating_scale", "warnings", "generated", "session_frames", "missing",
           "unused_branches", "ratings", "skipped", "windows", "split_hash", "split_assignment", "branch_dims",
           "stats", "input_dims", "frames", "train_target_mean", "manifest_hash")


def feature_manifest_hash(store: FeatureStore, sessions: list[str], branches: list[str],
                          excluded: set[tuple[str, str]] = frozenset()) -> str:
    """Identifies the features a model saw: the signatures of the sessions' branches (those in `excluded`,
    masked by training, count as absent) and of the story embeddings every window reads."""
    stories = store.entry(DATASET_KEY, "stories") or {}
    return canonical_hash({"sessions": store.manifest_hash(sessions, branches, excluded=excluded),
                           "stories": stories.get("signature")})


@register_model("fusion_data", aliases=("empathic_fusion.datamodules.empathy_datamodule.EmpathyDataModule",))
class FusionDataModule(L.LightningDataModule):
    def __init__(self, dataset_dir: str, store_dir: str, modalities: list[str], features: dict[str, Any],
                 name: str = _D.name, scenario: str = _D.scenario, window_frames: int = _D.window_frames,
                 stride_seconds: float = _D.stride_seconds, split_fractions: tuple[float, ...] = _D.split_fractions,
                 split_seed: int = _D.split_seed, oversample: bool = _D.oversample, batch_size: int = _D.batch_size,
                 num_workers: int = _D.num_workers, normalize: tuple[str, ...] = _D.normalize,
                 demo: dict[str, Any] | None = None, extract_workers: int = _D.extract_workers, seed: int = 0,
                 cv_folds: int = _D.cv_folds, cv_fold: int = _D.cv_fold, on_stale: str = _D.on_stale,
                 loader: str = _D.loader, frames: str = _D.frames, device_memory_gb: float | None = _D.device_memory_gb,
                 device_frames_dtype: str = _D.device_frames_dtype, frame_cache_dir: str | None = _D.frame_cache_dir,
                 allow_shared_media: bool = _D.allow_shared_media, predict: bool = False,
                 stats: dict[str, tuple[Any, Any]] | None = None):
        super().__init__()
        unknown = set(modalities) - set(MODALITIES)
        if not modalities or unknown:
            raise ValueError(f"modalities must be a non-empty subset of {list(MODALITIES)}, got {modalities}")
        self.dataset_dir = Path(dataset_dir)
        self.store_dir = Path(store_dir)
        self.modalities = list(modalities)
        self.features = features
        self.branches = {m: modality_branches(m, features) for m in self.modalities}
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
        self.cv_folds, self.cv_fold = int(cv_folds), int(cv_fold)  # cv_folds > 1: participant K-fold, this fold tests
        self.on_stale = on_stale  # stale or damaged stored branches: mask them with a warning, or stop
        self.loader = loader  # choices and ranges of the data settings are the schema's (config/data.py)
        self.frames_place = frames  # auto | memory | disk: where the batched loader's frame arrays live
        # frame arrays on the training GPU up to this size (None: a share of its free memory at setup), in this type
        self.device_memory_gb = None if device_memory_gb is None else float(device_memory_gb)
        self.device_frames_dtype = getattr(torch, device_frames_dtype)
        self.frame_cache_dir = Path(frame_cache_dir) if frame_cache_dir else self.store_dir / "frame_cache"
        self.allow_shared_media = bool(allow_shared_media)  # one recording in two participants' sessions: warn, not stop
        self.predict = bool(predict)  # one predict split over the whole dataset, z-scored with `stats`
        self.predict_stats = {m: (np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32))
                              for m, (mean, std) in (stats or {}).items()}
        self.extraction_report = None  # what prepare_data's extraction did (failures, warnings)
        self.datasets: dict[str, WindowBatches | WindowDataset] = {}
        self.gather_in_step = False  # the train loader yields window positions (gather_training_batches_in_step)
        self.frames: FrameArrays | None = None
        self.warnings: list[str] = []
        self.ratings = pd.DataFrame()  # one row per self-rating, set by setup
        self.skipped: dict[int, str] = {}  # rating (row of self.ratings) without windows -> why
        self.session_frames: dict[str, int] = {}  # frames per readable session, set by setup
        self.dataset: EmpathyDataset | None = None  # what setup read (sessions, transcripts, fps)
        self.rating_scale: RatingScale = SELF_REPORT  # the dataset's (dataset.yaml rating_scale), set by setup
        self._prepared = False

    # ---- preparation -------------------------------------------------------------------------
    def prepare_data(self) -> None:
        if self._prepared:  # Lightning calls this again in fit/test; once per process is enough
            return
        if self._reuse_kept_setup():  # an earlier job of this sweep set up the same data from the same files
            return
        if self.demo is not None:
            from empathic_fusion.demo.generate import DemoConfig, generate_demo

            generate_demo(self.dataset_dir, DemoConfig(**self.demo), workers=self.extract_workers)
        store = FeatureStore(self.store_dir)
        dataset = load_dataset(self.dataset_dir, self.modalities, self.allow_shared_media, store.file_hash,
                               ratings_required=not self.predict)
        for warning in dataset.warnings:
            warn_data(warning)
        if not self.predict:  # a dataset too small for the splits stops here, before anything is extracted
            check_participants(dataset.ratings.participant_id, self.split_fractions, self.cv_folds)
        report = extract_features(dataset, store, self.modalities, self.features, workers=self.extract_workers)
        log.info(report.summary())
        for warning in report.warnings:
            warn_data(warning)
        self.extraction_report = report
        self._prepared = True

    # ---- setup ---------------------------------------------------------------------------------
    def _session_frames(self, dataset: EmpathyDataset, store: FeatureStore) -> tuple[dict[str, int], set]:
        """Frames per session, and what is masked: (session, modality) or (session, modality, branch)
        for branches that are absent, stale (extracted from other inputs or settings than the dataset and
        config now give) or damaged. Stale and damaged branches are never read: masked with a warning,
        or an error when `on_stale=error`."""
        from empathic_fusion.core.sentence_encoder import encoder_identity

        features = with_defaults(self.features)
        identity = encoder_identity(features["text"]["model_path"])
        frames, missing, unusable = {}, set(), []
        self.unused_branches: set[tuple[str, str]] = set()
        for sid in dataset.sessions.index:
            if sid not in dataset.transcripts:
                continue
            lengths = []
            for modality in self.modalities:
                found = 0
                for branch in self.branches[modality]:
                    masked = modality if len(self.branches[modality]) == 1 else f"the {branch} part of {modality}"
                    entry = store.manifest(sid).get(branch)  # recorded, even if a file is gone since
                    problem = None if entry is None else branch_problem(store, dataset, sid, branch, entry,
                                                                        features, identity)
                    if entry is None:
                        self.warnings.append(f"session '{sid}': no {branch} features in the store "
                                             f"(see {store.root / 'failures.json'}); {masked} is masked for it")
                    elif problem:
                        unusable.append(f"session '{sid}', branch '{branch}': {problem}")
                        self.warnings.append(f"session '{sid}', branch '{branch}': {problem}; {masked} is masked "
                                             f"for it (run extract.py to refresh it, or data.on_stale=error to stop)")
                    else:
                        found += 1
                        lengths.append((BRANCHES[branch].source == "media", int(entry["n_frames"])))
                        continue
                    missing.add((sid, modality, branch))
                    self.unused_branches.add((sid, branch))
                if not found:
                    missing.add((sid, modality))
            used = [b for m in self.modalities for b in self.branches[m] if (sid, m, b) not in missing]
            self.warnings += stored_warnings(store, sid, used)  # found at extraction, repeated on every run
            if lengths:
                media = [n for is_media, n in lengths if is_media]
                frames[sid] = max(media) if media else max(n for _, n in lengths)
                text_end = max([n for is_media, n in lengths if not is_media], default=0)
                if media and text_end > frames[sid] + dataset.fps:  # the transcript outlasts the recording
                    self.warnings.append(
                        f"session '{sid}': the transcript runs to {dataset.transcripts[sid].end.max():.1f} s but the "
                        f"session's media end at {frames[sid] / dataset.fps:.1f} s; utterances past the end are not used")
            else:
                self.warnings.append(f"session '{sid}': none of {self.modalities} was extracted; its ratings are skipped")
        if unusable and self.on_stale == "error":
            raise StaleFeaturesError(f"{len(unusable)} stored branch(es) do not match the dataset or are damaged "
                                     f"(data.on_stale=error); run extract.py to refresh them:\n  "
                                     + "\n  ".join(unusable))
        return frames, missing

    def _check_splits(self, windows, n_participants: int) -> None:
        """Every split needs windows: an empty one stops the run before training, saying what to change."""
        for split in ("train", "val", "test"):
            if not (windows.split == split).any():
                how = (f"fold {self.cv_fold} of data.cv_folds={self.cv_folds}" if self.cv_folds
                       else f"data.split_fractions={list(self.split_fractions)}, data.split_seed={self.split_seed}")
                raise TooFewParticipantsError(
                    f"the {split} split has no {self.scenario} windows: {n_participants} participant(s) have windows "
                    f"and {how} gives none of them to {split}. Change data.split_fractions or data.split_seed (or "
                    "data.cv_folds), or add participants with ratings")

    def _valid_frames(self, sid: str, store: FeatureStore, n_frames: int, speaking: np.ndarray,
                      missing: set) -> np.ndarray:
        """Frames of a session where at least one selected modality has a valid frame (as the windows see it)."""
        valid = np.zeros(n_frames, dtype=bool)
        for modality in self.modalities:
            if (sid, modality) in missing:
                continue
            usable = np.zeros(n_frames, dtype=bool)
            for branch in self.branches[modality]:
                if (sid, modality, branch) in missing:
                    continue
                mask = (np.asarray(store.load(sid, branch, INDEXED[branch][1])) >= 0 if branch in INDEXED
                        else np.asarray(store.load(sid, branch, "mask")) > 0)[:n_frames]
                usable[: len(mask)] |= mask
            if modality == "audio":
                usable &= speaking[:n_frames] if len(speaking) >= n_frames else np.pad(speaking, (0, n_frames - len(speaking)))
            valid |= usable
        return valid

    def _skip_reasons(self, dataset: EmpathyDataset, session_frames: dict[str, int], windows) -> dict[int, str]:
        """Why each rating (row of self.ratings) without a window has none: no transcript, no readable
        modality, no phase, a phase past the media's end, or no valid frame in any window."""
        reasons = {}
        for index in sorted(set(self.ratings.index) - set(windows.rating_index)):
            rating = self.ratings.loc[index]
            frames = rating_frames(rating.session_id, rating.story_id, dataset.transcripts, session_frames,
                                   self.scenario, dataset.fps)
            reasons[int(index)] = frames if isinstance(frames, str) else (
                f"no window has a valid frame (a face, participant speech or transcript text) in any of {self.modalities}")
        return reasons

    def _drop_empty_windows(self, windows, store: FeatureStore, session_frames: dict[str, int], speaking: dict,
                            missing: set):
        """Leave out windows with no valid frame in any selected modality (they carry no evidence but
        would count in the metrics), and say how many per session."""
        keep = np.ones(len(windows), dtype=bool)
        for sid, rows in windows.groupby("session_id").indices.items():
            valid = np.concatenate([[0], np.cumsum(self._valid_frames(sid, store, session_frames[sid], speaking[sid],
                                                                      missing))])
            starts = np.clip(windows.start.to_numpy()[rows], 0, session_frames[sid])
            stops = np.clip(starts + self.window_frames, 0, session_frames[sid])
            keep[rows] = valid[stops] > valid[starts]
        if not keep.all():
            dropped = windows[~keep].session_id.value_counts().sort_index()
            self.warnings.append(f"left out {int((~keep).sum())} window(s) with no valid frame in any of "
                                 f"{self.modalities}: " + ", ".join(f"{s} ({n})" for s, n in dropped.items()))
        return windows[keep].reset_index(drop=True)

    def _read_windows(self, ratings_of=None) -> tuple[EmpathyDataset, FeatureStore, dict, dict, dict, pd.DataFrame]:
        """The dataset, its store, story embeddings' entry, frames and speech per session and the windows
        of every rating (of `ratings_of(dataset)` when given) that has a valid frame; setup's first half,
        shared by the train/val/test and the predict splits."""
        store = FeatureStore(self.store_dir)
        dataset = load_dataset(self.dataset_dir, self.modalities, self.allow_shared_media, store.file_hash,
                               ratings_required=not self.predict)
        self.dataset = dataset
        self.rating_scale = dataset.rating_scale
        self.warnings = list(dataset.warnings)
        self.generated = self.demo is not None or dataset.generated
        stories = store.entry(DATASET_KEY, "stories")
        if stories is None:
            raise RuntimeError(f"feature store {self.store_dir} has no story embeddings; run prepare_data/extract first")
        session_frames, missing = self._session_frames(dataset, store)
        self.session_frames = session_frames  # frames per readable session: where its media (and its windows) end
        self.missing = missing  # (session, modality[, branch]) that windows read as masked
        speaking = self._speaking(dataset, store, session_frames)
        self.ratings = ratings_of(dataset) if ratings_of is not None else dataset.ratings
        windows, notes = build_windows(self.ratings, dataset.transcripts, session_frames, self.scenario,
                                       dataset.fps, self.window_frames, self.stride_seconds)
        self.warnings += notes
        windows = self._drop_empty_windows(windows, store, session_frames, speaking, missing)
        self.skipped = self._skip_reasons(dataset, session_frames, windows)
        if windows.empty:
            raise RuntimeError(f"no {self.scenario} windows in {self.dataset_dir}; warnings: {self.warnings}")
        return dataset, store, stories, session_frames, speaking, windows

    def _speaking(self, dataset: EmpathyDataset, store: FeatureStore, session_frames: dict[str, int]) -> dict:
        """Per session, the frames that hold the participant's speech: the transcript and, when its modality is
        read, the speech source branch's voicing, as its settings' `speech_mask` says (transcript alone: no
        speech source branch)."""
        source = speech_branch()
        policy = with_defaults(self.features)[source]["speech_mask"] if source else "transcript"
        read = source is not None and BRANCHES[source].modality in self.modalities
        speaking = {}
        for sid, n in session_frames.items():
            entry = store.entry(sid, source) if read else None
            voiced = store.load(sid, source, "voiced") if entry and "voiced" in entry["arrays"] else None
            speaking[sid] = speech_mask(dataset.transcripts[sid], n, dataset.fps, voiced, policy)
        return speaking

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        if self.predict:
            self._setup_predict()
            return
        dataset, store, stories, session_frames, speaking, windows = self._read_windows()
        missing = self.missing
        # split the participants who have windows: one listed without sessions or ratings takes no place
        rated = sorted(set(dataset.ratings.participant_id.loc[windows.rating_index]))
        check_participants(rated, self.split_fractions, self.cv_folds, f"participants with {self.scenario} windows")
        if self.cv_folds:
            train_f, val_f, _ = self.split_fractions
            assignment = participant_folds(rated, self.cv_folds, self.cv_fold,
                                           val_f / (train_f + val_f), self.split_seed)
            self.split_hash = canonical_hash(assignment)
        else:
            assignment, self.split_hash = load_or_create_split(
                self.store_dir / "splits" / f"seed{self.split_seed}_{'-'.join(map(str, self.split_fractions))}.json",
                rated, self.split_fractions, self.split_seed)
        participant = dataset.ratings.participant_id.loc[windows.rating_index].to_numpy()
        windows["split"] = [assignment[p] for p in participant]
        self.split_assignment = assignment
        self._check_splits(windows, len(rated))
        self.windows = windows
        train_windows = windows[windows.split == "train"]
        self.branch_dims = {b: self._branch_dim(store, b, session_frames)
                            for m in self.modalities for b in self.branches[m]}
        self.stats = normalisation_stats(store, train_windows, {m: self.branches[m] for m in self.normalize},
                                         self.branch_dims, self.window_frames, speaking, missing)
        story_ids = stories["story_ids"]
        story_embeddings = np.asarray(store.load(DATASET_KEY, "stories", "embeddings"), dtype=np.float32)
        story_rows = {s: i for i, s in enumerate(story_ids)}
        source = FrameSource(store, self.branches, self.branch_dims, session_frames, speaking, self.stats, missing)
        self.input_dims = {**source.dims, "story": int(story_embeddings.shape[1]), "traits": len(TRAIT_COLUMNS)}
        traits = dataset.participants[list(TRAIT_COLUMNS)]
        if self.loader == "batched":
            self.frames = self._frame_arrays(source)
        for split in ("train", "val", "test"):
            if self.loader == "batched":
                self.datasets[split] = WindowBatches(
                    self.frames, windows[windows.split == split], dataset.ratings, self.window_frames, session_frames,
                    story_embeddings, story_rows, traits, self.rating_scale)
            else:
                self.datasets[split] = WindowDataset(source, windows[windows.split == split], dataset.ratings,
                                                     self.window_frames, story_embeddings, story_rows, traits,
                                                     self.rating_scale)
        self.train_target_mean = float(self.datasets["train"].targets.mean()) if len(train_windows) else 0.0
        self.manifest_hash = feature_manifest_hash(store, sorted(session_frames),
                                                   [b for m in self.modalities for b in self.branches[m]],
                                                   self.unused_branches)
        for warning in self.warnings:
            warn_data(warning)  # once per run, also when prepare_data's extraction found it
        log.info("windows: %s (split %s)", {s: len(d) for s, d in self.datasets.items()}, self.split_hash)
        if setup_cache.active():
            setup_cache.keep(self._setup_key(), self._inputs_fingerprint(),
                             {**{name: getattr(self, name) for name in _SET_UP}, "datasets": dict(self.datasets)},
                             self.frames.device if self.frames is not None else torch.device("cpu"))

    # ---- a set-up kept between the jobs of a sweep (setup_cache.py) ----------------------------
    def _setup_key(self) -> str:
        """Every setting the set-up depends on, and the device the frames are placed for (not the seed, batch
        size or loader workers, which only the loaders read)."""
        return canonical_hash({
            "dataset_dir": str(self.dataset_dir.resolve()), "store_dir": str(self.store_dir.resolve()),
            "frame_cache_dir": str(self.frame_cache_dir.resolve()), "modalities": self.modalities,
            "features": self.features, "name": self.name, "scenario": self.scenario, "window_frames": self.window_frames,
            "stride_seconds": self.stride_seconds, "split": [self.split_fractions, self.split_seed, self.cv_folds,
                                                             self.cv_fold],
            "normalize": self.normalize, "demo": self.demo, "on_stale": self.on_stale, "loader": self.loader,
            "frames": [self.frames_place, self.device_memory_gb, str(self.device_frames_dtype)],
            "allow_shared_media": self.allow_shared_media, "device": str(self._training_device())})

    def _inputs_fingerprint(self) -> str:
        return setup_cache.inputs_fingerprint([self.dataset_dir, self.store_dir])

    def _reuse_kept_setup(self) -> bool:
        """Take the set-up an earlier job of this sweep kept, when it is for the same settings and the dataset and
        store are unchanged since; its warnings are logged again, as every run logs them."""
        if self.predict or not setup_cache.active():
            return False
        kept = setup_cache.reuse(self._setup_key(), self._inputs_fingerprint())
        if kept is None:
            return False
        for name, value in kept.state.items():
            setattr(self, name, dict(value) if name == "datasets" else value)  # a job may swap a split's dataset
        self._prepared = True
        frames = self.frames
        where = ("read window by window" if frames is None else frames.where or f"in memory on {frames.device}")
        log.info("data: set up by job %s of this sweep, with the same settings; the dataset and store are unchanged "
                 "since, so their checks, the windows, the statistics and the frame arrays (%s) are reused",
                 kept.job, where)
        for warning in [*(self.extraction_report.warnings if self.extraction_report else []), *self.warnings]:
            warn_data(warning)
        log.info("windows: %s (split %s)", {s: len(d) for s, d in self.datasets.items()}, self.split_hash)
        return True

    def _frame_arrays(self, source: FrameSource) -> FrameArrays:
        """The batched loader's frame arrays where `frames` says (see `frames_place`), logged with why: in a GPU's
        memory in `device_frames_dtype`, elsewhere in float32."""
        device = self._training_device()
        layout = FrameLayout.of(source)
        on_gpu = device.type == "cuda"
        dtype = self.device_frames_dtype if on_gpu else torch.float32
        size = layout.dense_nbytes(dtype.itemsize)
        place, target, why = frames_place(self.frames_place, device, size, device_budget(device, self.device_memory_gb))
        if target.type != "cuda":
            dtype, size = torch.float32, layout.dense_nbytes()
        with timed("setup/frames"):
            frames = (frame_arrays_on_disk(source, self.frame_cache_dir) if place == "disk"
                      else FrameArrays.in_memory(source, target, dtype))
        log.info("frame arrays (%.2f GB in %s): %s (%s)", size / 1e9, str(dtype).replace("torch.", ""),
                 frames.where if place == "disk" else f"in memory on {target}", why)
        return frames

    def _setup_predict(self) -> None:
        """The predict split: every rated (session, story) pair, and every story for an unrated session
        (target NaN), read by the per-window loader (memory-mapped, so a long session is never held
        whole in memory), z-scored with the given training statistics."""
        unknown = [m for m in self.normalize if m not in self.predict_stats]
        if unknown:
            raise ValueError(f"the predict split z-scores {unknown} with a checkpoint's training statistics, and "
                             f"none were given for {unknown} (stats=...; a checkpoint keeps them, see "
                             "FusionModule.normalization)")
        dataset, store, stories, session_frames, speaking, windows = self._read_windows(predict_ratings)
        windows["split"] = "predict"
        self.windows, self.split_hash, self.split_assignment = windows, None, {}
        self.branch_dims = {b: self._branch_dim(store, b, session_frames)
                            for m in self.modalities for b in self.branches[m]}
        self.stats = {m: self.predict_stats[m] for m in self.normalize}
        embeddings = np.asarray(store.load(DATASET_KEY, "stories", "embeddings"), dtype=np.float32)
        source = FrameSource(store, self.branches, self.branch_dims, session_frames, speaking, self.stats,
                             self.missing)
        self.input_dims = {**source.dims, "story": int(embeddings.shape[1]), "traits": len(TRAIT_COLUMNS)}
        self.datasets["predict"] = WindowDataset(source, windows, self.ratings, self.window_frames, embeddings,
                                                 {s: i for i, s in enumerate(stories["story_ids"])},
                                                 dataset.participants[list(TRAIT_COLUMNS)], self.rating_scale)
        self.train_target_mean = float("nan")
        self.manifest_hash = store.manifest_hash(sorted(session_frames), [b for m in self.modalities for b in self.branches[m]],
                                                 excluded=self.unused_branches)
        for warning in self.warnings:
            warn_data(warning)

    def _branch_dim(self, store: FeatureStore, branch: str, session_frames: dict[str, int]) -> int:
        """Per-frame width of a branch, read from the first session that has it."""
        for sid in session_frames:
            entry = store.entry(sid, branch)
            if entry is not None:
                return branch_width(branch, entry)
        raise RuntimeError(f"no session has {branch} features in {store.root}")

    def describe(self) -> dict[str, Any]:
        """What a checkpoint records about the data it was trained on (the web app's model card shows
        the name, sessions, ratings, label, the rating scale (dataset.yaml's rating_scale: models map their
        predictions back onto it) and whether the data were generated)."""
        rated = self.ratings.loc[self.windows.rating_index.unique()]
        return {"dataset": self.name, "scenario": self.scenario, "modalities": self.modalities,
                "input_dims": self.input_dims, "window_frames": self.window_frames, "split_hash": self.split_hash,
                "feature_manifest_hash": self.manifest_hash,
                "windows": {s: len(d) for s, d in self.datasets.items()},
                "sessions": int(rated.session_id.nunique()), "participants": int(rated.participant_id.nunique()),
                "ratings": int(len(rated)), "labels": ["empathy"], "scale": self.rating_scale.bounds(),
                "generated": bool(self.generated)}

    def fitted_state(self) -> dict[str, Any]:
        """What a model is built from and its checkpoint keeps (models/base.py): the modalities and
        input dims, with the data's identity (split and feature-store hashes)."""
        return self.describe()

    # ---- loaders -------------------------------------------------------------------------------
    def _training_device(self) -> torch.device:
        trainer = getattr(self, "trainer", None)
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")

    def _loader(self, split: str, windows, loader: type[DataLoader] = DataLoader) -> DataLoader:
        """`windows`: the index sampler (None: in order); batched loaders wrap it into index batches. `loader`: the
        DataLoader class (the training split's is a ResumableLoader)."""
        data = self.datasets[split]
        if isinstance(data, WindowDataset):
            return loader(data, batch_size=self.batch_size, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, sampler=windows)
        device = self._training_device()
        where = self.frames.device
        for dataset in self.datasets.values():
            dataset.to(where)
        workers = self.num_workers if where.type == "cpu" else 0  # gathers on the device run in this process
        if windows is None:
            world, rank = _world()
            windows = DistributedSampler(range(len(data)), num_replicas=world, rank=rank, shuffle=False, seed=self.seed)
        return loader(data, sampler=IndexBatchSampler(windows, self.batch_size, device=where), batch_size=None,
                      num_workers=workers, persistent_workers=workers > 0,
                      pin_memory=where.type == "cpu" and device.type == "cuda")

    def gather_training_batches_in_step(self) -> Callable[[torch.Tensor], dict] | None:
        """From now on the train loader yields {"window": positions} (on the frame arrays' device) and the
        returned function gathers their batch, so a captured training step holds the gather (models/step_graph.py);
        None, and nothing changes, where the frames are read from disk or window by window."""
        data = self.datasets.get("train")
        if not isinstance(data, WindowBatches) or self.frames.disk:
            return None
        self.gather_in_step = True
        log.info("the training step gathers its batches from the frame arrays on %s", self.frames.device)
        return data.batch

    def train_dataloader(self) -> ResumableLoader:
        """The training windows in a seeded order (balanced by rating, or a plain shuffle), from a loader whose
        place in the epoch a mid-epoch checkpoint keeps (sampler.py ResumableLoader)."""
        data = self.datasets["train"]
        order = (RatingOversampler(np.round(data.ratings).astype(int), seed=self.seed) if self.oversample
                 else shuffled_windows(len(data), self.seed))
        loader = self._loader("train", order, ResumableLoader)
        if self.gather_in_step:  # the same sampler and batches, as positions: the step gathers them
            return ResumableLoader(WindowPositions(data), sampler=loader.sampler, batch_size=None)
        return loader

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", None)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", None)

    def predict_dataloader(self) -> DataLoader:
        if "predict" not in self.datasets:
            raise RuntimeError("the predict split exists when the datamodule is built with predict=True "
                               "(and stats=, a checkpoint's training statistics)")
        return DataLoader(self.datasets["predict"], batch_size=self.batch_size, num_workers=self.num_workers)


DEVICE_MEMORY_SHARE = 0.5  # data.device_memory_gb=null: frame arrays may take this share of the GPU's free memory


def device_budget(device: torch.device, device_memory_gb: float | None) -> tuple[float, str]:
    """(bytes the frame arrays may take on `device`, the budget in words): `device_memory_gb` when set, else
    DEVICE_MEMORY_SHARE of the GPU's free memory now (the rest for the model, its activations and other runs)."""
    if device_memory_gb is not None:
        return device_memory_gb * 1e9, f"data.device_memory_gb={device_memory_gb:g} on {device}"
    if device.type != "cuda":
        return 0.0, f"no budget on {device}"
    free, _ = torch.cuda.mem_get_info(device)
    budget = DEVICE_MEMORY_SHARE * free
    return budget, (f"{DEVICE_MEMORY_SHARE:.0%} of the {free / 1e9:.1f} GB free on {device} at setup "
                    f"({budget / 1e9:.1f} GB; data.device_memory_gb sets another budget)")


def frames_place(place: str, device: torch.device, size: float, budget: tuple[float, str]) -> tuple[str, torch.device, str]:
    """Where the batched loader keeps `size` bytes of frame arrays, as (memory | disk, device, why), given the
    training device's `budget` (`device_budget`: bytes, in words).
    `auto`: in the training GPU's memory when they fit the budget (batches gathered there), else out
    of core from disk (on a CPU always: the page cache then holds one copy for every concurrent run).
    `memory`: in memory, on the device when they fit, else in host memory."""
    fits, budget_text = size <= budget[0], budget[1]
    if place == "auto":
        if device.type == "cpu":
            return "disk", torch.device("cpu"), "training on the CPU: the page cache holds one copy for every run"
        if fits:
            return "memory", device, f"they fit {budget_text}"
        return "disk", torch.device("cpu"), f"they exceed {budget_text}"
    if place == "disk":
        return "disk", torch.device("cpu"), "data.frames=disk"
    if device.type == "cpu" or fits:
        return "memory", device, "data.frames=memory"
    return "memory", torch.device("cpu"), f"data.frames=memory; they exceed {budget_text}, so batches are gathered on the host"


def predict_ratings(dataset: EmpathyDataset) -> pd.DataFrame:
    """What the predict split scores: ratings.csv's (session, story) pairs with their ratings, and for a
    session with no rating one row per story its transcript names (reflection rows name the story
    reflected on), or per story of stories.csv when it names none, with an unknown (NaN) rating. An
    unrated session without a transcript has no phases, so no pair (the loader warns about it)."""
    rated = set(dataset.ratings.session_id)
    unrated = []
    for sid in dataset.sessions.index:
        transcript = dataset.transcripts.get(sid)
        if sid in rated or transcript is None:
            continue
        named = [s for s in dict.fromkeys(transcript.story_id) if s]
        unrated += [(sid, story, np.nan, dataset.sessions.participant_id[sid])
                    for story in (named or dataset.stories.index)]
    extra = pd.DataFrame(unrated, columns=["session_id", "story_id", "empathy", "participant_id"])
    return pd.concat([dataset.ratings, extra], ignore_index=True) if len(extra) else dataset.ratings
