"""Video: clips decoded and encoded with PyAV, faces tracked and smoothed over time,
each frame fused by the same engine as a photo.

``VideoFuser(fuser).fuse_video(source, clip, out)`` is the entry point (see
:mod:`facefuse.video.fuser`; the per-frame engine is :mod:`facefuse.video.engine`);
``facefuse video SOURCE CLIP -o OUT`` its command.
The names below load their module on first use, so that a light module of the
package (:mod:`facefuse.video.options`, which the CLI's parser reads) does not load
the engine and its models' runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from facefuse.video.engine import ClipFusion
    from facefuse.video.fuser import VideoFuser, VideoReport
    from facefuse.video.io import VideoInfo, VideoLimits, probe
    from facefuse.video.options import VideoOptions

__all__ = ["ClipFusion", "VideoFuser", "VideoInfo", "VideoLimits", "VideoOptions",
           "VideoReport", "probe"]

_HOMES = {"ClipFusion": "engine", "VideoFuser": "fuser", "VideoReport": "fuser",
          "VideoInfo": "io", "VideoLimits": "io", "probe": "io", "VideoOptions": "options"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
