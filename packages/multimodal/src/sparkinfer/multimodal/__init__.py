"""Media decoding for SparkInfer: data URLs, images (Pillow), video (PyAV).

The names below load on first use (PEP 562), so that reading `MediaLimits` (the server's
settings do, before anything heavy loads) does not import torch, Pillow or PyAV.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkinfer.multimodal.data_url import MediaLimits
    from sparkinfer.multimodal.errors import MediaError
    from sparkinfer.multimodal.processor import (
        MediaSize,
        ProcessedMedia,
        ProcessorConfig,
        VisionTokenIds,
        content_hash,
        expand_prompt,
        measure_media,
        pad_runs,
        parse_processor_config,
        placeholder_ids,
        process_image,
        process_video,
    )
    from sparkinfer.multimodal.video_sampling import VideoSampling

__all__ = [
    "MediaError",
    "MediaLimits",
    "MediaSize",
    "ProcessedMedia",
    "ProcessorConfig",
    "VideoSampling",
    "VisionTokenIds",
    "content_hash",
    "expand_prompt",
    "measure_media",
    "pad_runs",
    "parse_processor_config",
    "placeholder_ids",
    "process_image",
    "process_video",
]
# Where each name lives: the processor's module, but for the torch-free ones.
_HOMES = dict.fromkeys(__all__, "sparkinfer.multimodal.processor") | {
    "MediaError": "sparkinfer.multimodal.errors",
    "MediaLimits": "sparkinfer.multimodal.data_url",
    "VideoSampling": "sparkinfer.multimodal.video_sampling",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sparkinfer.multimodal' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
