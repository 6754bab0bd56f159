"""Named index sets of MediaPipe's 478-point face mesh (468 face + 10 iris).

"Image-left" means the side with smaller x in an upright, frontal photo (the
subject's right). Index lists follow MediaPipe's face-mesh connection tables.
"""

from __future__ import annotations

FACE_OVAL: tuple[int, ...] = (
    10, 338, 297, 332, 284, 251, 389, 356, 454, 323, 361, 288, 397, 365, 379, 378, 400,
    377, 152, 148, 176, 149, 150, 136, 172, 58, 132, 93, 234, 127, 162, 21, 54, 103, 67, 109,
)
LIPS_OUTER: tuple[int, ...] = (
    61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291, 409, 270, 269, 267, 0, 37, 39, 40, 185,
)
LIPS_INNER: tuple[int, ...] = (
    78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308, 415, 310, 311, 312, 13, 82, 81, 80, 191,
)
#: Eye contours, in polygon order.
EYE_IMAGE_LEFT: tuple[int, ...] = (
    33, 7, 163, 144, 145, 153, 154, 155, 133, 173, 157, 158, 159, 160, 161, 246,
)
EYE_IMAGE_RIGHT: tuple[int, ...] = (
    263, 249, 390, 373, 374, 380, 381, 382, 362, 398, 384, 385, 386, 387, 388, 466,
)
BROW_IMAGE_LEFT: tuple[int, ...] = (46, 53, 52, 65, 55, 70, 63, 105, 66, 107)
BROW_IMAGE_RIGHT: tuple[int, ...] = (276, 283, 282, 295, 285, 300, 293, 334, 296, 336)
IRIS_A: tuple[int, ...] = (468, 469, 470, 471, 472)
IRIS_B: tuple[int, ...] = (473, 474, 475, 476, 477)

NOSE_TIP = 1
NOSE_BASE = 2
CHIN = 152
FOREHEAD = 10
FACE_EDGE_IMAGE_LEFT = 234
FACE_EDGE_IMAGE_RIGHT = 454
MOUTH_CORNERS = (61, 291)
INNER_LIP_MID = (13, 14)
EYE_OUTER = (33, 263)
EYE_INNER = (133, 362)
EYE_LID_IMAGE_LEFT = (159, 145)
EYE_LID_IMAGE_RIGHT = (386, 374)

#: Mouth corners and jaw line: where the lower face is anchored when the jaw's
#: opening (expression) must stay the target's.
LOWER_FACE_ANCHORS: tuple[int, ...] = (
    61, 291, 152, 148, 176, 149, 150, 136, 172, 58, 377, 400, 378, 379, 365, 397, 288,
)

#: Points that move little with expression: used to fit head pose and to bring
#: one face's mesh into another's pose (eye corners, nose bridge and tip,
#: temples, upper face oval).
STABLE_POINTS: tuple[int, ...] = (
    33, 133, 263, 362, 168, 6, 197, 195, 5, 4, 1, 2, 98, 327,
    10, 338, 297, 332, 284, 251, 389, 356, 454, 109, 67, 103, 54, 21, 162, 127, 234,
    9, 8, 193, 417, 122, 351,
)
