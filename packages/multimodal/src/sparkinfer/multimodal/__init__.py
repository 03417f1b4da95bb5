"""Media decoding for SparkInfer: data URLs, images (Pillow), video (PyAV)."""

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

__all__ = [
    "MediaError",
    "MediaLimits",
    "MediaSize",
    "ProcessedMedia",
    "ProcessorConfig",
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
