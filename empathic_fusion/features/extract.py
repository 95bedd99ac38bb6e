"""Fill a feature store for a dataset: extract what is missing or stale, skip what is up to date.

Branches: each one is a unit (empathic_fusion/features/branch_unit.py) registered by its extractor file with
its facts, settings, signature, extractor and size; this file reads the units, never a branch's name:
  face   MediaPipe face mesh (1451 per frame) or imported OpenFace CSVs (253)   -> video (video_branches.py)
  cnn    EfficientNet-Lite0 (1280) or ResNet50 (2048) frame embeddings        -> video (video_branches.py)
  audio  openSMILE LLDs (65 ComParE_2016 / 25 eGeMAPSv02) + voicing             -> audio (audio_smile.py)
  text   Sentence-BERT per participant utterance (384)                         -> text (text_sbert.py)
  glove  GloVe per word (50 packaged / 300 for glove.840B.300d)                -> text (text_glove.py)
  stories (dataset level) Sentence-BERT of each story read, with the text branch's encoder

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
from empathic_fusion.core.branches import BRANCHES, media_branches
from empathic_fusion.core.versions import NOT_INSTALLED
from empathic_fusion.dataset import EmpathyDataset
from empathic_fusion.features.branch_unit import MediaJob, TranscriptRun, branch_unit, failure_record
from empathic_fusion.features.store import (DATASET_KEY, FeatureStore, StoreIntegrityError, StoreReadOnlyError,
                                            StoreSpaceError, rows_folder)
from empathic_fusion.features.store_lock import ExtractionLock
from empathic_fusion.features.store_space import check_free_space
from empathic_fusion.features.text_sbert import TEXT_VERSION, text_chunking

log = logging.getLogger(__name__)


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


def branch_signature(store: FeatureStore, dataset: EmpathyDataset, session_id: str, branch: str, cfg: dict,
                     text_identity: str | None = None) -> dict:
    """What a session's branch would be extracted from now (extractor, version, config, input hashes).

    One source for extraction (is the store up to date?) and for training (is a stored branch stale?).
    Raises OSError/ValueError when an input is missing or unreadable. `cfg` is a with_defaults() config.
    """
    unit = branch_unit(branch)
    if unit.spec.source == "transcript" and session_id not in dataset.transcripts:
        raise ValueError(f"session '{session_id}' has no transcript")
    return unit.signature(store, dataset, session_id, cfg, text_identity)


# ---- workers -------------------------------------------------------------------------------------
def _media_job(job: dict[str, Any]) -> dict[str, Any]:
    """Worker: extract the media branches of one session, each pass once (`job["extractors"]`: the branches'
    extract_media functions and the branches each gives); never raises. A long session's rows are written to
    a rows folder in the session's store folder while they are computed ("rows_dir" of the result: the main
    process removes it once it has written the branches); a disk that runs full there is the result's
    "disk_full" (the branch and the error), not a failure."""
    if job.get("threads"):
        import torch

        torch.set_num_threads(int(job["threads"]))  # a share of the run's threads per worker process
    rows_dir = rows_folder(Path(job["owner_dir"]))
    media = MediaJob(job["session_id"], Path(job["video"]), Path(job["audio"]), job["fps"], job["cfg"], rows_dir)
    results = {}
    for extract, branches in job["extractors"]:
        try:
            results.update(extract(media, branches))
        except Exception as error:  # noqa: BLE001 - every failure is reported, the others go on
            for branch in branches:
                media.fail(branch, error)
    return {"session_id": media.session_id, "results": results, "failures": media.failures,
            "rows_dir": str(rows_dir), "disk_full": media.disk_full}


def _media_job_for(dataset: EmpathyDataset, store: FeatureStore, session_id: str, todo: dict[str, dict],
                   cfg: dict) -> dict[str, Any]:
    """A session's media job: its branches to do with their signatures, grouped by the pass that gives them."""
    session = dataset.sessions.loc[session_id]
    extractors: dict[Callable, list[str]] = {}
    for branch in todo:
        extractors.setdefault(branch_unit(branch).extract_media, []).append(branch)
    return {"session_id": session_id, "branches": list(todo), "signatures": todo, "fps": dataset.fps,
            "owner_dir": str(store.owner_dir(session_id)), "video": str(session.video),
            "audio": str(session.audio or session.video), "cfg": cfg, "extractors": list(extractors.items())}


def stored_warnings(store: FeatureStore, sid: str, branches: list[str]) -> list[str]:
    """The warnings about a session's data that extraction stored with the given branches (and the
    video/audio length difference when both kinds are among them), worded as extraction logged them."""
    notes = []
    for branch in branches:
        entry = store.entry(sid, branch) or {}
        notes += [_session_note(sid, branch, note) for note in entry.get("warnings", [])]
    media = {BRANCHES[b].medium for b in branches if b in BRANCHES}
    if {"video", "audio"} <= media:
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
    video, audio = _medium_entry(store, sid, "video"), _medium_entry(store, sid, "audio")
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


def _transcript_past_media_warning(store: FeatureStore, sid: str, transcript_end: float) -> str | None:
    """A transcript that runs more than a second past the end of the session's media (a transcript of a longer
    recording, or times in another unit): what training will do about it, said when the session is extracted."""
    entries = [entry for entry in (_medium_entry(store, sid, medium) for medium in ("video", "audio")) if entry]
    if not entries:
        return None
    fps = float(entries[0]["signature"]["config"]["fps"])
    media_end = max(int(entry["n_frames"]) for entry in entries) / fps
    if transcript_end <= media_end + 1.0:
        return None
    return (f"session '{sid}': the transcript runs to {transcript_end:.1f} s but the session's media end at "
            f"{media_end:.1f} s; utterances past the end are not used (training and prediction leave them out)")


def _medium_entry(store: FeatureStore, sid: str, medium: str) -> dict | None:
    """The manifest entry of the session's first recorded media branch that reads `medium` (video, audio)."""
    for branch in media_branches():
        entry = store.entry(sid, branch) if BRANCHES[branch].medium == medium else None
        if entry:
            return entry
    return None


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
    for branch in wanted:
        branch_unit(branch)  # an unknown branch stops the run here (UnknownBranchError), never a per-session failure
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
    media_sessions = dict.fromkeys(sid for sid, branch in report.extracted if branch in media_branches())
    for session_id in media_sessions:  # once per session, however many of its media branches were redone
        note = _length_warning(store, session_id)
        if note:
            report.warnings.append(note)
    for session_id in dict.fromkeys(sid for sid, _ in report.extracted if sid in dataset.transcripts):
        note = _transcript_past_media_warning(store, session_id, float(dataset.transcripts[session_id].end.max()))
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
            if BRANCHES[branch].source == "transcript" and session_id not in dataset.transcripts:
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
    """Extract and write what the plan holds: the stories here, each transcript branch here for all its
    sessions at once, the media branches in worker processes."""
    text_cfg = dict(cfg["text"])  # the stories share the text branch's encoder
    encoder = None

    def text_encoder():
        nonlocal encoder
        if encoder is None:
            from empathic_fusion.core.sentence_encoder import SentenceEncoder

            encoder = SentenceEncoder(text_cfg["model_path"], batch_size=int(text_cfg["batch_size"]),
                                      device=text_cfg["device"])
        return encoder

    if "stories" in plan.todo.get(DATASET_KEY, {}):
        embeddings = text_encoder().encode(dataset.stories.text.tolist())
        _write(store, report, DATASET_KEY, "stories", {"embeddings": embeddings.astype(np.float16)},
               plan.todo[DATASET_KEY]["stories"], {"story_ids": dataset.stories.index.tolist()})
    transcripts: dict[str, list[tuple[str, dict]]] = {name: [] for name in BRANCHES}
    jobs = []
    for session_id, planned in plan.todo.items():
        if session_id == DATASET_KEY:
            continue
        media = {branch: signature for branch, signature in planned.items() if BRANCHES[branch].source == "media"}
        for branch in set(planned) - set(media):
            transcripts[branch].append((session_id, planned[branch]))
        if media:
            jobs.append(_media_job_for(dataset, store, session_id, media, cfg))
    run = TranscriptRun(dataset, cfg, text_encoder,
                        write=lambda owner, branch, arrays, signature, info, notes: _write(
                            store, report, owner, branch, arrays, signature, info, notes),
                        fail=lambda owner, branch, error: report.failures.append(failure_record(owner, branch, error)))
    for branch, todo in transcripts.items():
        if todo:
            branch_unit(branch).extract_transcripts(run, todo)
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
        spoken = [(sid, t) for sid, transcript in dataset.transcripts.items()
                  for t in transcript.text[transcript.speaker.isin(speakers)].astype(str)]
        warn_untrained_languages(f"transcripts, field 'text' (speakers {speakers})", [t for _, t in spoken],
                                 languages, name, sources=[sid for sid, _ in spoken])


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
                for branch in media_branches():
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
