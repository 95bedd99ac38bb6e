"""HDR video mapped to SDR, so the face mesh and the frame CNN (both trained on SDR pictures) see what an SDR
recording of the scene would show.

A 10-bit HLG or PQ (HDR10) recording decoded as it is gives a flat, dim picture: its signal encodes light
on another curve (PQ up to 10,000 nits, HLG scene light) in BT.2020's wider primaries. Here a frame's
signal goes to linear light (PQ's EOTF, SMPTE ST 2084; HLG's inverse OETF and the BT.2100 OOTF for a
1,000-nit display), to BT.709's primaries, is scaled so that HDR reference white (203 nits, ITU-R BT.2408)
is SDR's white, has the highlights above a knee rolled off into the rest of SDR's range, and is encoded
with BT.709's display curve (BT.1886, gamma 2.4) as 8 bits.
"""
from __future__ import annotations

import numpy as np

PQ, HLG = "PQ", "HLG"
_TRANSFERS = {16: PQ, 18: HLG}  # FFmpeg's AVCOL_TRC_SMPTE2084 and AVCOL_TRC_ARIB_STD_B67
REFERENCE_WHITE_NITS = 203.0
HLG_DISPLAY_NITS, HLG_GAMMA = 1000.0, 1.2
KNEE = 0.75  # share of SDR white below which light is kept as it is; above, highlights roll off towards white
BT2020_TO_BT709 = np.array([[1.6605, -0.5876, -0.0728], [-0.1246, 1.1329, -0.0083], [-0.0182, -0.1006, 1.1187]],
                           dtype=np.float32)
BT2020_LUMA = np.array([0.2627, 0.6780, 0.0593], dtype=np.float32)
_M1, _M2, _C1, _C2, _C3 = 0.1593017578125, 78.84375, 0.8359375, 18.8515625, 18.6875
_A, _B, _C = 0.17883277, 0.28466892, 0.55991073


def transfer(frame) -> str | None:
    """"PQ" or "HLG" for a frame (PyAV) whose transfer characteristic is one of them, else None (SDR)."""
    return _TRANSFERS.get(int(getattr(frame, "color_trc", 0) or 0))


def pq_to_nits(signal: np.ndarray) -> np.ndarray:
    """PQ's EOTF (SMPTE ST 2084): signal in [0, 1] -> display light in nits."""
    p = np.power(np.clip(signal, 0.0, 1.0), 1.0 / _M2)
    return 10000.0 * np.power(np.maximum(p - _C1, 0.0) / (_C2 - _C3 * p), 1.0 / _M1)


def hlg_to_nits(signal: np.ndarray) -> np.ndarray:
    """HLG's inverse OETF (ARIB STD-B67) and the BT.2100 OOTF of a 1,000-nit display: signal (..., 3) in [0, 1]
    -> display light in nits."""
    e = np.clip(signal, 0.0, 1.0)
    scene = np.where(e <= 0.5, e * e / 3.0, (np.exp((e - _C) / _A) + _B) / 12.0)
    luma = np.maximum(scene @ BT2020_LUMA, 1e-6)[..., None]
    return HLG_DISPLAY_NITS * np.power(luma, HLG_GAMMA - 1.0) * scene


def roll_off(relative: np.ndarray) -> np.ndarray:
    """Light relative to SDR white: kept below KNEE, above it brought smoothly (slope 1 at the knee) towards 1."""
    over = np.maximum(relative - KNEE, 0.0)
    return np.where(relative <= KNEE, relative, KNEE + (1.0 - KNEE) * (1.0 - np.exp(-over / (1.0 - KNEE))))


def sdr_bgr(frame) -> np.ndarray:
    """An HDR frame (PyAV, PQ or HLG) as the BGR uint8 image an SDR recording would give (module docstring)."""
    from av.video.reformatter import Colorspace

    rgb = frame.reformat(format="rgb48le", src_colorspace=Colorspace.BT2020).to_ndarray()
    signal = rgb.astype(np.float32) / 65535.0
    nits = pq_to_nits(signal) if transfer(frame) == PQ else hlg_to_nits(signal)
    light = np.clip((nits / REFERENCE_WHITE_NITS) @ BT2020_TO_BT709.T, 0.0, None)
    sdr = np.power(roll_off(light), 1.0 / 2.4)
    return np.ascontiguousarray((np.clip(sdr, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)[..., ::-1])
