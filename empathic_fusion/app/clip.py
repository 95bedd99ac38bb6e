"""Score one uploaded clip with a fusion checkpoint, through the project's own pipeline.

The clip becomes a one-session dataset in the contract's layout (docs/dataset.md) in a scratch
folder, so the dataset loader validates it (a bad transcript CSV is answered with file, line and
field), `extract_features` fills a scratch store with the checkpoint's feature config, and the
windows (empathic_fusion/datamodules/windows.py) feed `WindowDataset` with the training normalisation stats the
checkpoint carries. Windows cover the whole clip (stride as in training): the clip is one phase.
Problems a user can fix (no face, no audio, too short, unreadable, too big, bad transcript) raise
ClipError with a message for the page.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import yaml

from empathic_fusion.features.speech import speech_mask
from empathic_fusion.datamodules.window_dataset import FrameSource, WindowDataset, target_to_rating
from empathic_fusion.datamodules.windows import window_starts
from empathic_fusion.dataset import TRAIT_COLUMNS, DatasetError, load_dataset
from empathic_fusion.features.branches import branch_width, modality_branches, with_defaults
from empathic_fusion.features.extract import extract_features
from empathic_fusion.features.media import MediaError, probe_video
from empathic_fusion.features.store import DATASET_KEY, FeatureStore
from empathic_fusion.metrics import aggregate_by_rating
from empathic_fusion.models.empathy_module import EmpathyModule

SESSION, PARTICIPANT, STORY = "clip", "uploader", "typed_story"
VIDEO_TYPES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v")
AUDIO_TYPES = (".wav", ".mp3", ".flac", ".ogg", ".m4a")


class ClipError(ValueError):
    """An upload the app cannot score; the message says what is wrong and what to do."""


@dataclass
class ClipResult:
    rating: float  # predicted self-rated empathy for the clip (1-5): mean over its windows
    window_seconds: np.ndarray  # centre of each window, seconds
    window_ratings: np.ndarray  # predicted empathy per window (1-5)
    fps: float
    face_found: np.ndarray | None  # per frame, None when the model has no video modality
    speech: np.ndarray | None  # per frame, None when the model has no audio modality
    warnings: list[str]


def spread_text(text: str, seconds: float, phase: str, story_id: str = "") -> pd.DataFrame:
    """Plain text as participant utterances, one per sentence, spread evenly over the clip."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
    edges = np.linspace(0.0, seconds, len(sentences) + 1)
    return pd.DataFrame({"start": edges[:-1], "end": edges[1:], "speaker": "participant", "phase": phase,
                         "story_id": story_id, "text": sentences})


class ClipScorer:
    """A fusion checkpoint ready to score clips: model, feature config, window settings, stats."""

    def __init__(self, ckpt_path: str | Path, max_upload_mb: float = 200.0):
        self.ckpt_path = Path(ckpt_path)
        if not self.ckpt_path.is_file():
            raise FileNotFoundError(f"fusion checkpoint {self.ckpt_path} does not exist "
                                    "(train.py writes checkpoints/*.ckpt)")
        self.model = EmpathyModule.load_from_checkpoint(self.ckpt_path, map_location="cpu", weights_only=False).eval()
        if not self.model.normalization and self.model.hparams.run_config["data"].get("normalize"):
            raise ValueError(f"{self.ckpt_path} carries no training normalisation statistics (checkpoints written "
                             "before they were recorded); retrain to score new clips with it")
        run_config = self.model.hparams.run_config
        self.data_cfg = dict(run_config["data"])
        self.features = with_defaults(run_config["features"])
        self.modalities = list(self.model.hparams.modalities)
        self.window_frames = int(self.data_cfg["window_frames"])
        self.stride_seconds = float(self.data_cfg.get("stride_seconds", 1.0))
        self.scenario = self.data_cfg.get("scenario", "story_share")
        self.max_upload_mb = float(max_upload_mb)
        self.dataset_dir = Path(self.data_cfg["dataset_dir"])
        self.fps = self._training_fps()

    def _training_fps(self) -> float:
        meta = self.dataset_dir / "dataset.yaml"
        if meta.is_file():
            return float(yaml.safe_load(meta.read_text())["fps"])
        return 15.0  # the paper's clock; the checkpoint's dataset folder is not here

    def stories(self) -> dict[str, str]:
        """The training dataset's stories (id -> text) to pick from; empty when its folder is not here."""
        path = self.dataset_dir / "stories.csv"
        if not path.is_file():
            return {}
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
        return dict(zip(table.story_id, table.text))

    def describe(self) -> str:
        seconds = self.window_frames / self.fps
        return (f"{self.model.describe()['net'].rsplit('.', 1)[-1]} on {'+'.join(self.modalities)}; "
                f"windows of {self.window_frames} frames ({seconds:g} s) every {self.stride_seconds:g} s")

    # ---- checks before any extraction -------------------------------------------------------------
    def _check_file(self, path: Path, kinds: tuple[str, ...], what: str) -> None:
        if not path.is_file():
            raise ClipError(f"{what} {path.name}: file not found")
        size_mb = path.stat().st_size / 2 ** 20
        if size_mb > self.max_upload_mb:
            raise ClipError(f"{what} {path.name} is {size_mb:.1f} MB, over the {self.max_upload_mb:g} MB upload limit "
                            "(serve.py max_upload_mb=...)")
        if path.suffix.lower() not in kinds:
            raise ClipError(f"{what} {path.name}: unsupported file type '{path.suffix}'; use one of {', '.join(kinds)}")

    def _probe_seconds(self, video: Path) -> float:
        try:
            info = probe_video(video)
        except MediaError as error:
            raise ClipError(f"unreadable video {video.name}: {error}") from None
        frames = info.frames_at(self.fps)
        if frames < self.window_frames:
            raise ClipError(f"the clip is {frames / self.fps:.1f} s long, shorter than one window "
                            f"({self.window_frames / self.fps:g} s); upload a longer clip")
        return frames / self.fps

    # ---- the clip as a one-session dataset -----------------------------------------------------------
    def _write_dataset(self, root: Path, video: Path, audio: Path | None, transcript: Path | str | None,
                       story_text: str, seconds: float) -> None:
        media = root / "media"
        media.mkdir(parents=True)
        shutil.copy(video, media / f"video{video.suffix.lower()}")
        audio_rel = ""
        if audio is not None:
            shutil.copy(audio, media / f"audio{audio.suffix.lower()}")
            audio_rel = f"media/audio{audio.suffix.lower()}"
        (root / "dataset.yaml").write_text(yaml.safe_dump({"name": "uploaded_clip", "fps": self.fps}))
        pd.DataFrame({"participant_id": [PARTICIPANT], **{c: [""] for c in TRAIT_COLUMNS}}).to_csv(
            root / "participants.csv", index=False)
        pd.DataFrame({"session_id": [SESSION], "participant_id": [PARTICIPANT],
                      "video": [f"media/video{video.suffix.lower()}"], "audio": [audio_rel]}).to_csv(
            root / "sessions.csv", index=False)
        stories = {**self.stories(), STORY: story_text}
        pd.DataFrame({"story_id": list(stories), "text": list(stories.values())}).to_csv(root / "stories.csv",
                                                                                          index=False)
        pd.DataFrame(columns=["session_id", "story_id", "empathy"]).to_csv(root / "ratings.csv", index=False)
        (root / "transcripts").mkdir()
        target = root / "transcripts" / f"{SESSION}.csv"
        if isinstance(transcript, Path):
            shutil.copy(transcript, target)
        else:  # plain text spread over the clip, or nothing: one agent turn marks the whole clip as the phase
            story = STORY if self.scenario == "reflection" else ""  # reflection rows name their story
            table = (spread_text(transcript, seconds, self.scenario, story) if transcript and transcript.strip() else
                     pd.DataFrame({"start": [0.0], "end": [seconds], "speaker": ["agent"], "phase": [self.scenario],
                                   "story_id": [story], "text": [""]}))
            table.to_csv(target, index=False)

    def score(self, video: str | Path, story_text: str, audio: str | Path | None = None,
              transcript: str | Path | None = None, progress: Callable[[float, str], Any] | None = None) -> ClipResult:
        """Predicted empathy for the clip and per window; `transcript` is a contract CSV path or plain text."""
        step = progress or (lambda fraction, message: None)
        if not story_text or not story_text.strip():
            raise ClipError("type the story the person heard, or pick one of the dataset's stories")
        video = Path(video)
        self._check_file(video, VIDEO_TYPES, "video")
        audio = Path(audio) if audio else None
        if audio is not None:
            self._check_file(audio, AUDIO_TYPES, "audio")
        if isinstance(transcript, Path):  # a contract CSV; a str is plain text
            self._check_file(transcript, (".csv",), "transcript")
        step(0.05, "checking the clip")
        seconds = self._probe_seconds(video)
        with tempfile.TemporaryDirectory(prefix="empathy-clip-") as scratch:
            root = Path(scratch) / "dataset"
            self._write_dataset(root, video, audio, transcript, story_text, seconds)
            try:
                dataset = load_dataset(root)
            except DatasetError as error:
                raise ClipError(f"the transcript does not parse: {error}") from None
            step(0.1, "extracting features (face, audio, text)")
            store = FeatureStore(Path(scratch) / "store")
            report = extract_features(dataset, store, self.modalities, self.features, workers=1, progress=True)
            self._check_failures(report.failures)
            step(0.9, "running the model over the windows")
            return self._predict(dataset, store, report.warnings)

    def _check_failures(self, failures: list[dict]) -> None:
        for failure in failures:
            error = failure["error"]
            if failure["branch"] == "audio":
                raise ClipError(f"no audio track could be read ({error}); "
                                "upload a video with sound or a separate audio file")
            raise ClipError(f"unreadable or unsupported {failure['branch']} input: {error}")

    def _predict(self, dataset, store: FeatureStore, warnings: list[str]) -> ClipResult:
        branches = {m: modality_branches(m, self.features) for m in self.modalities}
        branch_dims, frames = {}, []
        for modality in self.modalities:
            for branch in branches[modality]:
                entry = store.entry(SESSION, branch)
                branch_dims[branch] = branch_width(branch, entry)
                frames.append(int(entry["n_frames"]))
        n_frames = max(frames)
        face = None
        if "face" in branch_dims:
            face = np.asarray(store.load(SESSION, "face", "mask")) > 0
            if not face.any():
                raise ClipError("no face found in any frame of the video; upload a clip that shows the person's face")
        transcript = dataset.transcripts[SESSION]
        voiced = None
        if "audio" in self.modalities and "voiced" in store.entry(SESSION, "audio")["arrays"]:
            voiced = store.load(SESSION, "audio", "voiced")
        speaking = speech_mask(transcript, n_frames, dataset.fps, voiced, self.features["audio"]["speech_mask"])
        stride = max(int(round(self.stride_seconds * dataset.fps)), 1)
        starts = window_starts((0, n_frames), n_frames, self.window_frames, stride)
        if n_frames < self.window_frames:
            raise ClipError(f"the clip gives {n_frames / dataset.fps:.1f} s of features, shorter than one window "
                            f"({self.window_frames / dataset.fps:g} s)")
        windows = pd.DataFrame({"rating_index": 0, "session_id": SESSION, "start": starts})
        ratings = pd.DataFrame({"session_id": [SESSION], "story_id": [STORY], "empathy": [np.nan],
                                "participant_id": [PARTICIPANT]})  # no self-rating: the target is unknown (NaN)
        stories = store.entry(DATASET_KEY, "stories")
        embeddings = np.asarray(store.load(DATASET_KEY, "stories", "embeddings"), dtype=np.float32)
        input_dims = {m: sum(branch_dims[b] for b in branches[m]) for m in self.modalities}
        input_dims.update(story=int(embeddings.shape[1]), traits=len(TRAIT_COLUMNS))
        self.model.check_input_dims(input_dims, self.modalities)
        stats = {m: (mean.numpy(), std.numpy()) for m, (mean, std) in self.model.normalization.items()}
        source = FrameSource(store, branches, branch_dims, {SESSION: n_frames},
                             {SESSION: speaking}, stats)
        data = WindowDataset(source, windows, ratings, self.window_frames, embeddings,
                             {s: i for i, s in enumerate(stories["story_ids"])}, dataset.participants[list(TRAIT_COLUMNS)])
        batch = torch.utils.data.default_collate([data[i] for i in range(len(data))])
        with torch.no_grad():
            pred = self.model(batch).float()
        rating_pred, _, _ = aggregate_by_rating(pred, torch.zeros_like(pred), batch["rating_index"])
        return ClipResult(rating=float(target_to_rating(rating_pred[0].item())),
                          window_seconds=(starts + self.window_frames / 2) / dataset.fps,
                          window_ratings=np.asarray(target_to_rating(pred.numpy())), fps=dataset.fps,
                          face_found=face, speech=speaking if "audio" in self.modalities else None, warnings=warnings)
