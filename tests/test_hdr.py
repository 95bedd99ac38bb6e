"""HDR video (10-bit PQ and HLG, made here from the real Pexels recording as an HDR camera would encode it:
BT.2020 primaries, SDR white at HDR reference white, 203 nits) is named in the branches' warnings and mapped
to SDR before the face mesh and the CNN read it: the CNN's embedding of each mapped frame is within a cosine
of 0.96 of the SDR frame's (the frames decoded as they are fall below it)."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from empathic_fusion.features.hdr import BT2020_LUMA, HLG_DISPLAY_NITS, HLG_GAMMA, REFERENCE_WHITE_NITS
from empathic_fusion.features.media import iter_frames
from empathic_fusion.utils import PROJECT_ROOT

CLIP = PROJECT_ROOT.parent / "shared" / "data" / "media" / "WolfgangLanger_Pexels.mp4"
pytestmark = pytest.mark.skipif(not CLIP.exists(), reason="../shared/data/media is not beside the checkout")
BT709_TO_BT2020 = np.array([[0.6274, 0.3293, 0.0433], [0.0691, 0.9195, 0.0114], [0.0164, 0.0880, 0.8956]])


def pq_signal(nits: np.ndarray) -> np.ndarray:
    """SMPTE ST 2084's inverse EOTF: display light (nits) -> PQ signal in [0, 1]."""
    y = np.clip(nits / 10000.0, 0.0, 1.0) ** 0.1593017578125
    return ((0.8359375 + 18.8515625 * y) / (1.0 + 18.6875 * y)) ** 78.84375


def hlg_signal(nits: np.ndarray) -> np.ndarray:
    """BT.2100's inverse OOTF (1,000-nit display) and HLG's OETF: display light (nits, ..., 3) -> signal."""
    display_luma = np.maximum(nits @ BT2020_LUMA, 1e-6)[..., None]
    scene_luma = (display_luma / HLG_DISPLAY_NITS) ** (1.0 / HLG_GAMMA)
    scene = np.clip(nits / (HLG_DISPLAY_NITS * scene_luma ** (HLG_GAMMA - 1.0)), 0.0, None)
    a, b, c = 0.17883277, 0.28466892, 0.55991073
    return np.where(scene <= 1 / 12, np.sqrt(3 * scene), a * np.log(np.maximum(12 * scene - b, 1e-9)) + c)


def write_hdr(frames: list[np.ndarray], kind: str, path: Path) -> None:
    """10-bit HEVC of SDR frames as an HDR camera records the scene: BT.1886 light in BT.2020 primaries, SDR
    white at 203 nits, on the PQ or HLG curve, with the stream's colour description set."""
    import av
    from av.video.reformatter import Colorspace

    height, width = frames[0].shape[:2]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx265", rate=15)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p10le"
        context = stream.codec_context
        context.color_primaries, context.colorspace = 9, 9  # BT.2020
        context.color_trc = 16 if kind == "PQ" else 18  # SMPTE ST 2084 | ARIB STD-B67
        stream.options = {"x265-params": "log-level=error:crf=12"}
        for k, bgr in enumerate(frames):
            light = (bgr[..., ::-1].astype(np.float64) / 255.0) ** 2.4 @ BT709_TO_BT2020.T
            signal = (pq_signal if kind == "PQ" else hlg_signal)(REFERENCE_WHITE_NITS * light)
            frame = av.VideoFrame.from_ndarray((np.clip(signal, 0, 1) * 65535 + 0.5).astype(np.uint16), format="rgb48le")
            frame = frame.reformat(format="yuv420p10le", dst_colorspace=Colorspace.BT2020)
            frame.pts, frame.time_base = k, Fraction(1, 15)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


@pytest.mark.parametrize("kind", ["PQ", "HLG"])
def test_hdr_video_is_named_and_mapped_to_sdr_before_the_cnn(kind, tmp_path):
    import av

    from empathic_fusion.features.cnn_frames import FrameEmbedder

    sdr = [image for _, _, image in iter_frames(CLIP, 15.0)][:12]
    video = tmp_path / f"{kind}.mp4"
    write_hdr(sdr, kind, video)
    notes: list[str] = []
    mapped = [image for _, _, image in iter_frames(video, 15.0, notes)]
    with av.open(str(video)) as container:
        as_decoded = [frame.to_ndarray(format="bgr24") for frame in container.decode(video=0)]
    assert any(note.startswith(f"HDR video ({kind}, 10-bit): its frames are mapped to SDR") for note in notes), notes
    embedder = FrameEmbedder(device="cpu", batch_size=8)
    embedded = [embedder.embed([embedder.prepare(x) for x in images]) for images in (sdr, mapped, as_decoded)]
    cosine = [(embedded[0] * e).sum(1) / np.linalg.norm(embedded[0], axis=1) / np.linalg.norm(e, axis=1)
              for e in embedded[1:]]
    assert cosine[0].min() >= 0.96, cosine[0]
    assert cosine[1].min() < cosine[0].min()  # decoded as it is, the picture is further from the SDR one
