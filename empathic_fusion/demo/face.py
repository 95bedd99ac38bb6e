"""Deterministic talking-face video rendered from a real photograph.

The demo needs face video that a real face tracker (MediaPipe face mesh) accepts, with known ground
truth for expression and head pose. We take the portrait ``skimage.data.astronaut()`` (Eileen
Collins; it ships inside scikit-image, so no download) and animate it by image warping only:

* expression: smooth displacement fields around facial points of that photo, applied to a face
  region with one ``cv2.remap`` (plus a blend towards a pre-rendered closed-eye patch for blinks
  and a dark mouth cavity that opens between the teeth and the lower lip);
* head pose: the person layer is treated as a plane and rotated in 3-D (yaw, pitch, roll about a
  pivot behind the face) and shifted, which is one ``cv2.warpPerspective``;
* the person is composited over a face-free studio backdrop built from the same photo, so a frame
  with ``face_visible=0`` is just that backdrop.

All geometry below was measured once on the 512x512 photo (MediaPipe face mesh with
``refine_landmarks=True``, static image mode; mesh indices are given in the comments) and is stored
as constants, so rendering needs neither MediaPipe nor any randomness. Every per-size asset is built
once and cached; a frame then costs two warps and a few small array operations.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np

FACE_CONTROLS = ("smile", "mouth_open", "brow_raise", "eye_open", "yaw", "pitch", "roll", "shift_x", "shift_y",
                 "face_visible")
# Value used for a control that the caller leaves out: neutral expression, open eyes, frontal and visible.
CONTROL_DEFAULTS = {"smile": 0.0, "mouth_open": 0.0, "brow_raise": 0.0, "eye_open": 1.0, "yaw": 0.0, "pitch": 0.0,
                    "roll": 0.0, "shift_x": 0.0, "shift_y": 0.0, "face_visible": 1.0}

# ---- Measurements on skimage.data.astronaut(), (x, y) pixels of the 512x512 photo ---------------------------
# Eye contours (mesh 33,246,161,160,159,158,157,173,133,155,154,153,145,144,163,7 for the eye on the image left,
# mirrored indices 263,466,...,249 for the other one).
_EYES = (
    np.array([(195.2, 100.9), (196.1, 100.1), (197.2, 99.2), (199.4, 98.1), (202.8, 97.6), (206.3, 98.1),
              (209.7, 99.9), (212.2, 102.3), (213.3, 103.7), (212.2, 103.9), (210.1, 104.0), (206.8, 104.3),
              (203.4, 104.3), (200.1, 103.8), (197.9, 103.0), (196.5, 102.2)]),
    np.array([(255.8, 104.3), (255.0, 103.2), (253.9, 102.1), (251.9, 100.6), (248.3, 99.7), (244.7, 100.0),
              (241.2, 101.6), (238.4, 103.7), (237.0, 104.9), (238.0, 105.3), (240.2, 105.6), (243.3, 106.2),
              (246.6, 106.7), (250.0, 106.6), (252.5, 106.1), (254.2, 105.4)]),
)
_BROWS = ((202.0, 88.5), (249.5, 91.5))          # middle of mesh 70..107 and 300..336
_MOUTH_CORNERS = ((201.8, 139.2), (245.0, 141.0))  # mesh 61, 291
_CHEEKS = ((194.9, 124.6), (253.2, 128.0))       # mesh 205, 425
_TEETH_EDGE_Y = 148.5     # lower edge of the upper teeth at the mouth centre (between mesh 13 and 14), by eye
_MOUTH_CENTER_X = 223.3   # mesh 13/14
_CHIN_Y = 177.4           # mesh 152
_EYE_LINE_DEG = 3.2       # tilt of the line from mesh 33 to mesh 263; removed so that roll=0 is level
_PIVOT = (223.5, 125.0)   # between eyes and mouth (around mesh 1): centre of head rotation in the image plane
# Outline of hair, face, neck, collar ring and suit (traced from a saturation threshold, then simplified by hand);
# everything outside it is studio backdrop, flag or shuttle model.
_PERSON_OUTLINE = np.array([
    (203, 22), (163, 51), (153, 67), (156, 102), (182, 132), (183, 148), (167, 150), (143, 163), (134, 175),
    (133, 191), (124, 192), (121, 183), (120, 199), (114, 200), (100, 216), (75, 232), (45, 262), (28, 300),
    (20, 511), (362, 511), (362, 325), (352, 286), (337, 258), (307, 236), (298, 218), (291, 218), (279, 199),
    (255, 178), (266, 137), (276, 133), (296, 108), (301, 89), (296, 59), (282, 36), (250, 19), (227, 16)],
    dtype=np.int32)
# Studio backdrop between the flag (x < 100) and the shuttle model (x > 352).
_BACKDROP_X = (100, 352)
_CROP_CENTER = (225.0, 118.0)   # photo point shown at the frame centre when the head is at rest
_CROP_SIDE = 224.0              # photo pixels across the frame (the face is ~40 % of the frame width)
_FACE_ROI = (170, 62, 278, 214)  # x0, y0, x1, y1: the only region the expression warps touch

# ---- Expression strengths, in photo pixels at control value 1 -----------------------------------------------
_SMILE_REST = 0.6           # the photo already smiles; smile=0 pulls the corners in and down from it
_SMILE_CORNER = (4.5, 6.0)  # outward, upward shift of each lip corner per unit of smile
_SMILE_CHEEK = 2.0          # upward shift of the cheeks per unit of smile
_BROW_LIFT = 5.0
_JAW_DROP = 13.0
_GAP_STRETCH = 0.12          # an open mouth gap of height h shows a 0.12 h strip of the teeth edge, stretched
_MOUTH_COLOR = (34, 30, 58)  # BGR of the mouth cavity
_FOCAL = 2.2                 # focal length of the virtual camera, in frame widths
_PIVOT_DEPTH = 0.25          # how far the rotation pivot lies behind the face plane, in frame widths


def _gauss(x: np.ndarray, y: np.ndarray, center: tuple[float, float], sx: float, sy: float) -> np.ndarray:
    return np.exp(-0.5 * (((x - center[0]) / sx) ** 2 + ((y - center[1]) / sy) ** 2))


class _Rig:
    """Everything that depends only on the output size, built once per size."""

    def __init__(self, size: int):
        from skimage import data

        self.size = size
        scale = size / _CROP_SIDE
        self.scale = scale
        photo = np.ascontiguousarray(data.astronaut()[:, :, ::-1])  # RGB -> BGR
        mask = np.zeros(photo.shape[:2], np.uint8)
        cv2.fillPoly(mask, [_PERSON_OUTLINE], 255)
        mask = cv2.GaussianBlur(mask, (0, 0), 1.2)
        self.backdrop = self._backdrop(photo, mask, size)

        # Person layer (BGRA) in "canvas" coordinates = photo coordinates * scale.
        canvas_side = int(np.ceil(photo.shape[0] * scale))
        up = cv2.INTER_CUBIC if scale > 1 else cv2.INTER_AREA
        self.canvas = cv2.resize(np.dstack([photo, mask]), (canvas_side, canvas_side), interpolation=up)

        x0, y0, x1, y1 = (int(round(v * scale)) for v in _FACE_ROI)
        self.roi = (slice(y0, y1), slice(x0, x1))
        # Face-region grid, in photo pixels (p*) for defining fields.
        gx, gy = np.meshgrid(np.arange(x1 - x0, dtype=np.float32), np.arange(y1 - y0, dtype=np.float32))
        self.gx, self.gy = gx, gy  # remap grid, local to the face region
        px, py = (gx + x0) / scale, (gy + y0) / scale

        # Backward displacement per unit control (canvas px): sample from p - u(p) to move content by u.
        fields = {}
        sm_x = np.zeros_like(px)
        sm_y = np.zeros_like(px)
        for corner, side in zip(_MOUTH_CORNERS, (-1.0, 1.0)):
            g = _gauss(px, py, corner, 7.0, 7.0)
            sm_x += side * _SMILE_CORNER[0] * g
            sm_y -= _SMILE_CORNER[1] * g
        for cheek in _CHEEKS:
            sm_y -= _SMILE_CHEEK * _gauss(px, py, cheek, 10.0, 9.0)
        fields["smile"] = (-sm_x * scale, -sm_y * scale)
        brow = sum(_gauss(px, py, c, 14.0, 6.5) for c in _BROWS)
        fields["brow_raise"] = (np.zeros_like(px), brow * _BROW_LIFT * scale)
        self.fields = {k: (v[0].astype(np.float32), v[1].astype(np.float32)) for k, v in fields.items()}

        # Mouth opening: lower lip and jaw drop below the edge of the upper teeth; the gap is a dark cavity.
        (lx, ly), (rx, ry) = _MOUTH_CORNERS
        half = (rx - lx) / 2
        t = np.clip((px[0] - _MOUTH_CENTER_X) / half, -1.0, 1.0)
        mid = (ly + ry) / 2  # parabola through both corners and the teeth edge at the centre
        seam = mid + (ry - ly) / 2 * t + (_TEETH_EDGE_Y - mid) * (1 - t ** 2)
        width = np.clip(1.15 - np.abs((px[0] - _MOUTH_CENTER_X) / half) ** 2, 0.0, 1.0) ** 0.7
        below = py - seam[None, :]
        chin_fall = np.clip((py - _CHIN_Y) / 30.0, 0.0, 1.0)
        self.seam = (seam * scale - y0).astype(np.float32)[None, :]
        self.jaw = np.where(below >= 0, width[None, :] * 0.5 * (1 + np.cos(np.pi * chin_fall)), 0).astype(np.float32)
        self.mouth_width = width.astype(np.float32)[None, :]

        # Blink: blend the eyes towards a closed-eye version (eye opening in-painted with skin, plus lashes).
        eye_mask = np.zeros(photo.shape[:2], np.uint8)
        closed = photo.copy()
        for eye in _EYES:
            cv2.fillPoly(eye_mask, [np.round(eye).astype(np.int32)], 255)
        eye_mask = cv2.dilate(eye_mask, np.ones((5, 5), np.uint8))  # reach past the lashes to plain skin
        closed = cv2.inpaint(closed, eye_mask, 5, cv2.INPAINT_TELEA)
        for eye in _EYES:
            lid = np.vstack([eye[8:], eye[:1]])  # lower lid, where the closed lid's lashes rest
            lid[:, 1] -= 1.0
            cv2.polylines(closed, [np.round(lid * 4).astype(np.int32)], False, (40, 52, 70), 1, cv2.LINE_AA, shift=2)
        closed = cv2.GaussianBlur(closed, (0, 0), 0.6)
        closed_canvas = cv2.resize(closed, (canvas_side, canvas_side), interpolation=up)[self.roi]
        alpha = cv2.GaussianBlur(cv2.dilate(eye_mask, np.ones((3, 3), np.uint8)), (0, 0), 1.0)
        alpha = cv2.resize(alpha, (canvas_side, canvas_side), interpolation=cv2.INTER_LINEAR)[self.roi]
        self.eye_alpha = (alpha.astype(np.float32) / 255.0)[:, :, None]
        face = self.canvas[self.roi]
        self.eye_delta = (closed_canvas.astype(np.float32) - face[:, :, :3]) * self.eye_alpha

    @staticmethod
    def _backdrop(photo: np.ndarray, mask: np.ndarray, size: int) -> np.ndarray:
        """Face-free backdrop: the photo's studio wall, with the person region filled by normalized convolution."""
        valid = (cv2.dilate(mask, np.ones((7, 7), np.uint8)) == 0).astype(np.float32)
        valid[:, :_BACKDROP_X[0]] = 0
        valid[:, _BACKDROP_X[1]:] = 0
        img = photo.astype(np.float32)
        smooth = cv2.GaussianBlur(img * valid[:, :, None], (0, 0), 28) / np.maximum(
            cv2.GaussianBlur(valid, (0, 0), 28), 1e-4)[:, :, None]
        weight = cv2.GaussianBlur(valid, (0, 0), 3)[:, :, None]
        wall = cv2.GaussianBlur(img * valid[:, :, None], (0, 0), 3) / np.maximum(weight, 1e-4)
        full = np.where(weight > 0.5, wall, smooth)
        full = cv2.GaussianBlur(full, (0, 0), 1.5)
        frame = cv2.warpAffine(full, _frame_from_photo(size)[:2], (size, size), flags=cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_REPLICATE)
        return frame.round().clip(0, 255).astype(np.uint8)

    def pose_matrix(self, yaw: float, pitch: float, roll: float, shift_x: float, shift_y: float) -> np.ndarray:
        """Homography from canvas pixels to frame pixels for a head pose (degrees) and shift (frame fractions)."""
        size = self.size
        f = _FOCAL * size
        a, b, c = np.radians([-pitch, yaw, roll - _EYE_LINE_DEG])
        rx = np.array([[1, 0, 0], [0, np.cos(a), np.sin(a)], [0, -np.sin(a), np.cos(a)]])
        ry = np.array([[np.cos(b), 0, -np.sin(b)], [0, 1, 0], [np.sin(b), 0, np.cos(b)]])
        rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
        rot = rz @ ry @ rx
        depth = _PIVOT_DEPTH * size
        # Face plane at z = -depth in pivot coordinates; camera at distance f from the face plane.
        t = -depth * rot[:, 2] + np.array([0.0, 0.0, f + depth])
        plane = np.column_stack([rot[:, 0], rot[:, 1], t])
        pivot_frame = _frame_from_photo(size) @ np.array([_PIVOT[0], _PIVOT[1], 1.0])
        k = np.array([[f, 0, pivot_frame[0] + shift_x * size], [0, f, pivot_frame[1] + shift_y * size], [0, 0, 1]])
        to_pivot = np.array([[1, 0, -_PIVOT[0] * self.scale], [0, 1, -_PIVOT[1] * self.scale], [0, 0, 1]])
        return k @ plane @ to_pivot


def _frame_from_photo(size: int) -> np.ndarray:
    """Affine map (3x3) from photo pixels to frame pixels with the head at rest (before the level correction)."""
    scale = size / _CROP_SIDE
    return np.array([[scale, 0, size / 2 - _CROP_CENTER[0] * scale], [0, scale, size / 2 - _CROP_CENTER[1] * scale],
                     [0, 0, 1]])


@lru_cache(maxsize=4)
def _rig(size: int) -> _Rig:
    return _Rig(size)


def _control_arrays(controls: dict[str, np.ndarray]) -> tuple[int, dict[str, np.ndarray]]:
    unknown = set(controls) - set(FACE_CONTROLS)
    if unknown:
        raise ValueError(f"unknown face controls {sorted(unknown)}; expected a subset of {FACE_CONTROLS}")
    arrays = {k: np.asarray(v, dtype=np.float64).ravel() for k, v in controls.items()}
    lengths = {len(v) for v in arrays.values()}
    if len(lengths) != 1:
        raise ValueError(f"face control arrays differ in length: { {k: len(v) for k, v in arrays.items()} }")
    n = lengths.pop()
    return n, {k: arrays.get(k, np.full(n, CONTROL_DEFAULTS[k])) for k in FACE_CONTROLS}


def render_face_frames(controls: dict[str, np.ndarray], size: int = 256) -> Iterator[np.ndarray]:
    """Yields one BGR uint8 frame (size x size x 3) per index of the control arrays.

    controls: names from FACE_CONTROLS -> float arrays of one common length n_frames. smile, mouth_open,
    brow_raise, eye_open in [0, 1] (eye_open 1 = open, 0 = closed); yaw/pitch/roll in degrees (about -20..20;
    +yaw turns the face towards the image right, +pitch nods the chin down, +roll tilts the eye line clockwise
    in the image); shift_x/shift_y as a fraction of the frame size (about -0.1..0.1, + is right/down);
    face_visible 0/1 (0 shows only the empty backdrop). A missing name takes its CONTROL_DEFAULTS value
    (smile 0, mouth_open 0, brow_raise 0, eye_open 1, angles 0, shifts 0, face_visible 1); at least one
    array must be given so the length is known. The output depends on the controls only.
    """
    n, c = _control_arrays(controls)
    rig = _rig(int(size))
    canvas = rig.canvas.copy()  # the face region of this copy is rewritten every frame
    face = rig.canvas[rig.roi].astype(np.float32)
    sx, sy = rig.fields["smile"]
    bx, by = rig.fields["brow_raise"]
    for i in range(n):
        if c["face_visible"][i] < 0.5:
            yield rig.backdrop.copy()
            continue
        smile = float(np.clip(c["smile"][i], 0, 1)) - _SMILE_REST
        brow = float(np.clip(c["brow_raise"][i], 0, 1))
        closed = 1.0 - float(np.clip(c["eye_open"][i], 0, 1))
        drop = float(np.clip(c["mouth_open"][i], 0, 1)) * _JAW_DROP * rig.scale

        src = face
        if closed > 0:
            src = face.copy()
            src[:, :, :3] += closed * rig.eye_delta
        map_x = rig.gx + smile * sx + brow * bx
        map_y = rig.gy + smile * sy + brow * by
        if drop > 0:
            below = rig.gy - rig.seam
            shifted = rig.gy - drop * rig.jaw
            stretched = rig.seam + _GAP_STRETCH * below  # the gap samples a thin strip at the teeth edge
            map_y += np.where(below > 0, np.maximum(shifted, stretched), rig.gy) - rig.gy
        warped = cv2.remap(src, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        if drop > 0:
            gap = drop * rig.mouth_width / (1 - _GAP_STRETCH)  # where the two branches above meet
            below = rig.gy - rig.seam
            cavity = np.clip(np.minimum(below, gap - below) / 1.5, 0, 1) * 0.9 * (rig.mouth_width > 0.05)
            warped[:, :, :3] += cavity[:, :, None] * (np.asarray(_MOUTH_COLOR, np.float32) - warped[:, :, :3])
        canvas[rig.roi] = warped.round().clip(0, 255).astype(np.uint8)

        pose = rig.pose_matrix(c["yaw"][i], c["pitch"][i], c["roll"][i], c["shift_x"][i], c["shift_y"][i])
        person = cv2.warpPerspective(canvas, pose, (rig.size, rig.size), flags=cv2.INTER_LINEAR,
                                     borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0, 0))
        alpha = person[:, :, 3:].astype(np.float32) * (1.0 / 255.0)
        frame = rig.backdrop + alpha * (person[:, :, :3].astype(np.float32) - rig.backdrop)
        yield frame.round().astype(np.uint8)


def write_face_video(path: Path, controls: dict[str, np.ndarray], fps: float = 15.0, size: int = 256) -> int:
    """Writes an MJPG .avi with cv2.VideoWriter; returns the number of frames written.

    MJPG in AVI is the one codec/container pair that OpenCV's bundled FFmpeg can always write and read.
    Raises RuntimeError if the writer cannot open (e.g. a missing directory or an unsupported suffix).
    """
    path = Path(path)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), float(fps), (int(size), int(size)))
    if not writer.isOpened():
        raise RuntimeError(f"cv2.VideoWriter could not open {path} (MJPG/.avi, {size}x{size} @ {fps} fps)")
    count = 0
    try:
        for frame in render_face_frames(controls, size):
            writer.write(frame)
            count += 1
    finally:
        writer.release()
    return count
