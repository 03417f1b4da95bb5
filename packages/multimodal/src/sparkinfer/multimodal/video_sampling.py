"""How frames are sampled from a video for the model: server policy, not the checkpoint's."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkinfer.multimodal.data_url import HELP


@dataclass(frozen=True)
class VideoSampling:
    """The frame rate and frame budget of a video's sampling (`parse_processor_config` takes
    them). Each field's default and description (metadata `HELP`) are the server's: its
    settings `video_fps` and `video_max_frames` take them from here, so each is declared once."""

    fps: float = field(default=2.0, metadata={HELP: "Frames sampled per second of video"})
    max_frames: int = field(
        default=32,
        metadata={
            HELP: "Most frames sampled from one video for the model (longer clips: sparser); "
            "video_max_source_frames bounds the source stream"
        },
    )
