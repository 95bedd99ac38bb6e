"""Score one uploaded clip with a fusion checkpoint, through the training data path.

The clip becomes a one-session dataset in the contract's layout (docs/dataset.md) in a scratch
folder (the uploaded files are referenced where they lie, not copied or read into memory), and the
checkpoint's own data config builds an `FusionDataModule` with its predict split over it: `prepare_data`
validates the dataset (a bad transcript CSV is answered with file, line and field) and extracts its features
into a scratch store with the checkpoint's feature config, `setup` builds the windows (stride as in training;
the clip is one phase) z-scored with the training statistics the checkpoint carries, and the one predict loop
(models/predict.py) runs the module's `predict_step`. A clip shorter than one window is scored as one window,
as in training and `empathic-predict` (datamodules/windows.py), with a note among the result's warnings.
Problems a user can fix (no face, no audio, no frames, unreadable, too big, bad transcript) raise ClipError
with a message for the page that names the user's files, never the server's paths.
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import yaml

from empathic_fusion.core.errors import UserError
from empathic_fusion.evaluation.card import ModelCard, fusion_card
from empathic_fusion.config import FusionDataConfig
from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
from empathic_fusion.datamodules.windows import window_ends
from empathic_fusion.dataset import TRAIT_COLUMNS, DatasetError
from empathic_fusion.features.media import MediaError, probe_video
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.metrics import aggregate_by_rating
from empathic_fusion.models.checkpoints import WrongKindError, module_from, open_checkpoint
from empathic_fusion.models.predict import predict
from empathic_fusion.scoring.fusion import missing_statistics, predict_datamodule

SESSION, PARTICIPANT, STORY = "clip", "uploader", "typed_story"
VIDEO_TYPES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v")
AUDIO_TYPES = (".wav", ".mp3", ".flac", ".ogg", ".m4a")


class ClipError(UserError, ValueError):
    """An upload the app cannot score; the message says what is wrong and what to do."""


@dataclass
class ClipResult:
    rating: float  # predicted empathy for the clip (raw, on the training data's rating scale): mean of its windows
    window_seconds: np.ndarray  # centre of each window's frames inside the clip, seconds
    window_ratings: np.ndarray  # predicted empathy per window (raw, on the training data's rating scale)
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


class _UserNames:
    """Rewrites messages so that they name the user's files, never a server path."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def add(self, path: Path, name: str) -> None:
        self.names[str(path)] = name
        self.names[str(path.resolve())] = name

    def __call__(self, message: str) -> str:
        for path in sorted(self.names, key=len, reverse=True):
            message = message.replace(path, self.names[path])
        return message

class ClipScorer:
    """A fusion checkpoint ready to score clips: model, its data config, model card and upload limit."""

    def __init__(self, ckpt_path: str | Path, max_upload_mb: float = 2048.0, accelerator: str = "cpu"):
        try:
            opened = open_checkpoint(ckpt_path, kind="fusion")  # read once: the model and its card
        except WrongKindError as error:
            raise WrongKindError(f"{error}: a text checkpoint goes to text_ckpt_path=") from None
        self.ckpt_path = opened.path
        self.model = module_from(opened).eval()
        self.card: ModelCard = fusion_card(opened)
        run_config = self.model.hparams.run_config
        missing = missing_statistics(self.model)
        if missing:
            raise ValueError(f"{self.ckpt_path} carries no training normalisation statistics for {missing} "
                             "(checkpoints written before they were recorded); retrain to score new clips with it")
        self.data_cfg = dict(run_config["data"])
        self.features = dict(run_config["features"])
        self.modalities = list(self.model.modalities)
        self.window_frames = int(self.data_cfg["window_frames"])
        # a checkpoint's run config is saved data: keys it predates take the schema's default
        self.stride_seconds = float(self.data_cfg.get("stride_seconds", FusionDataConfig.stride_seconds))
        self.scenario = self.data_cfg.get("scenario", FusionDataConfig.scenario)
        self.max_upload_mb = float(max_upload_mb)
        self.accelerator = accelerator
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
        return (f"windows of {self.window_frames} frames ({seconds:g} s) every {self.stride_seconds:g} s "
                f"over {'+'.join(self.modalities)}")

    # ---- checks before any extraction -------------------------------------------------------------
    def _check_file(self, path: Path, name: str, kinds: tuple[str, ...], what: str) -> None:
        if not path.is_file():
            raise ClipError(f"{what} {name}: file not found")
        size_mb = path.stat().st_size / 2 ** 20
        if size_mb > self.max_upload_mb:
            raise ClipError(f"{what} {name} is {size_mb:.1f} MB, over the {self.max_upload_mb:g} MB upload limit "
                            "(serve.py max_upload_mb=...)")
        if Path(name).suffix.lower() not in kinds:
            raise ClipError(f"{what} {name}: unsupported file type '{Path(name).suffix}'; use one of {', '.join(kinds)}")

    def _probe_seconds(self, video: Path, name: str, user: _UserNames) -> float:
        try:
            info = probe_video(video)
        except MediaError as error:
            raise ClipError(user(f"unreadable video {name}: {error}")) from None
        frames = info.frames_at(self.fps)
        if not frames:
            raise ClipError(f"the video {name} has no frames; upload a recording")
        return frames / self.fps  # shorter than a window: scored as one, as in training (datamodules/windows.py)

    # ---- the clip as a one-session dataset -----------------------------------------------------------
    def _write_dataset(self, root: Path, video: Path, audio: Path | None, transcript: Path | str | None,
                       story_text: str, seconds: float) -> None:
        """The contract's files; sessions.csv names the uploads by absolute path (no copy)."""
        (root / "transcripts").mkdir(parents=True)
        (root / "dataset.yaml").write_text(yaml.safe_dump({"name": "uploaded_clip", "fps": self.fps}))
        pd.DataFrame({"participant_id": [PARTICIPANT], **{c: [""] for c in TRAIT_COLUMNS}}).to_csv(
            root / "participants.csv", index=False)
        pd.DataFrame({"session_id": [SESSION], "participant_id": [PARTICIPANT], "video": [str(video.resolve())],
                      "audio": [str(audio.resolve()) if audio is not None else ""]}).to_csv(
            root / "sessions.csv", index=False)
        pd.DataFrame({"story_id": [STORY], "text": [story_text]}).to_csv(root / "stories.csv", index=False)
        # no ratings: the predict split scores the unrated session against its one story
        pd.DataFrame(columns=["session_id", "story_id", "empathy"]).to_csv(root / "ratings.csv", index=False)
        target = root / "transcripts" / f"{SESSION}.csv"
        if isinstance(transcript, Path):
            target.write_bytes(transcript.read_bytes())
        else:  # plain text spread over the clip, or nothing: one agent turn marks the whole clip as the phase
            story = STORY if self.scenario == "reflection" else ""  # reflection rows name their story
            table = (spread_text(transcript, seconds, self.scenario, story) if transcript and transcript.strip() else
                     pd.DataFrame({"start": [0.0], "end": [seconds], "speaker": ["agent"], "phase": [self.scenario],
                                   "story_id": [story], "text": [""]}))
            table.to_csv(target, index=False)

    def datamodule(self, dataset_dir: Path, store_dir: Path) -> FusionDataModule:
        """The checkpoint's data config over another dataset: its predict split, the checkpoint's statistics."""
        return predict_datamodule(self.model, dataset_dir, store_dir)

    def score(self, video: str | Path, story_text: str, audio: str | Path | None = None,
              transcript: str | Path | None = None, progress: Callable[[float, str], Any] | None = None,
              names: dict[str, str] | None = None) -> ClipResult:
        """Predicted empathy for the clip and per window; `transcript` is a contract CSV path or plain text.
        `names` maps an upload's path to the user's file name (default: the path's own name)."""
        step = progress or (lambda fraction, message: None)
        names = names or {}
        user = _UserNames()
        if not story_text or not story_text.strip():
            raise ClipError("type the story the person heard, or pick one of the dataset's stories")
        uploads = {"video": Path(video), "audio": Path(audio) if audio else None,
                   "transcript": transcript if isinstance(transcript, Path) else None}  # a str is plain text
        kinds = {"video": VIDEO_TYPES, "audio": AUDIO_TYPES, "transcript": (".csv",)}
        for what, path in uploads.items():
            if path is not None:
                name = names.get(str(path), path.name)
                user.add(path, name)
                self._check_file(path, name, kinds[what], what)
        video_name = names.get(str(video), Path(video).name)
        step(0.05, "checking the clip")
        seconds = self._probe_seconds(Path(video), video_name, user)
        with tempfile.TemporaryDirectory(prefix="empathy-clip-") as scratch:
            root = Path(scratch) / "dataset"
            self._write_dataset(root, Path(video), uploads["audio"], transcript, story_text, seconds)
            if uploads["transcript"] is not None:  # the contract names it transcripts/clip.csv
                user.names[f"transcripts/{SESSION}.csv"] = names.get(str(transcript), transcript.name)
            user.add(root, "the upload")
            datamodule = self.datamodule(root, Path(scratch) / "store")
            step(0.1, "extracting features (face, audio, text)")
            try:
                datamodule.prepare_data()
            except DatasetError as error:
                raise ClipError("the transcript does not parse: "
                                + user("; ".join(str(problem) for problem in error.problems))) from None
            self._check_failures(datamodule.extraction_report.failures, user)
            self._check_face(FeatureStore(datamodule.store_dir))
            try:
                datamodule.setup("predict")
            except RuntimeError:
                raise ClipError("no window of the clip has a usable frame (a face, participant speech or "
                                "transcript text) for this model's modalities") from None
            step(0.9, "running the model over the windows")
            pred = predict(self.model, datamodule, self.accelerator)
            data = datamodule.datasets["predict"]
            starts = data.windows.start.to_numpy()
            ends = window_ends(starts, datamodule.session_frames[SESSION], self.window_frames)  # not past the end
            rating_index = torch.tensor(data.windows.rating_index.to_numpy(dtype=np.int64))
            clip_pred, _, _ = aggregate_by_rating(pred, torch.zeros_like(pred), rating_index)
            face = (np.asarray(FeatureStore(datamodule.store_dir).load(SESSION, "face", "mask")) > 0
                    if "face" in datamodule.branch_dims else None)
            warnings = list(dict.fromkeys(user(w) for w in datamodule.extraction_report.warnings + datamodule.warnings))
            scale = self.model.rating_scale  # the training data's, carried by the checkpoint
            return ClipResult(rating=float(scale.to_rating(clip_pred[0].item())),
                              window_seconds=(starts + ends) / 2 / self.fps,
                              window_ratings=np.asarray(scale.to_rating(pred.numpy())), fps=self.fps,
                              face_found=face,
                              speech=np.asarray(data.speaking[SESSION]) if "audio" in self.modalities else None,
                              warnings=warnings)

    def _check_failures(self, failures: list[dict], user: _UserNames) -> None:
        for failure in failures:
            error = user(failure["error"])
            if failure["branch"] == "audio":
                raise ClipError(f"no audio track could be read ({error}); "
                                "upload a video with sound or a separate audio file")
            raise ClipError(f"unreadable or unsupported {failure['branch']} input: {error}")

    def _check_face(self, store: FeatureStore) -> None:
        entry = store.entry(SESSION, "face")
        if entry is not None and not (np.asarray(store.load(SESSION, "face", "mask")) > 0).any():
            raise ClipError("no face found in any frame of the video; upload a clip that shows the person's face")
