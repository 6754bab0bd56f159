"""Video: clips decoded and encoded with PyAV, faces tracked and smoothed over time,
each frame fused by the same engine as a photo.

``VideoFuser(fuser).fuse_video(source, clip, out)`` is the entry point (see
:mod:`facefuse.video.engine`); ``facefuse video SOURCE CLIP -o OUT`` its command.
"""

from __future__ import annotations

from facefuse.video.engine import ClipFusion, VideoFuser, VideoOptions, VideoReport
from facefuse.video.io import VideoInfo, VideoLimits, probe

__all__ = ["ClipFusion", "VideoFuser", "VideoInfo", "VideoLimits", "VideoOptions",
           "VideoReport", "probe"]
