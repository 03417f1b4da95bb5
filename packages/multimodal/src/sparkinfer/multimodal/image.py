"""Images: decode with Pillow, resize to the 32-pixel patch grid, normalise, cut into patch vectors.

Resizing is bicubic with antialiasing on uint8 (`torch.nn.functional.interpolate`), the same
arithmetic as the checkpoint's `Qwen2VLImageProcessorFast`; a patch vector holds
(channel, temporal, py, px) values, patches come in merge-block order (docs/model.md §9).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError
from sparkinfer.multimodal.data_url import MediaLimits
from sparkinfer.multimodal.errors import MediaError, MediaTooLarge, UndecodableMedia

# MIME type -> Pillow format; Pillow is never asked to probe other formats (EPS runs Ghostscript)
IMAGE_MIME_TYPES = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/jpg": "JPEG",
    "image/webp": "WEBP",
    "image/gif": "GIF",
    "image/bmp": "BMP",
}
_PIL_FORMATS = tuple(sorted(set(IMAGE_MIME_TYPES.values())))
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class PatchConfig:
    """Patch geometry and pixel normalisation shared by images and video frames."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    def __post_init__(self) -> None:
        for name in ("patch_size", "temporal_patch_size", "merge_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"PatchConfig.{name} is {getattr(self, name)}; it must be >= 1")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ValueError(
                f"PatchConfig image_mean {self.image_mean} / image_std {self.image_std} need "
                f"3 values each, std > 0"
            )

    @property
    def factor(self) -> int:
        """Side of one merged token in pixels (32): resized sides are multiples of it."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Values in one patch vector: 3 * temporal * patch * patch (1536)."""
        return 3 * self.temporal_patch_size * self.patch_size**2


@dataclass(frozen=True)
class ImageConfig:
    """Resize bounds of an image in pixels (docs/model.md §1 preprocessor_config: 256² to 4096²)."""

    min_pixels: int = 65_536
    max_pixels: int = 16_777_216

    def __post_init__(self) -> None:
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"ImageConfig min_pixels {self.min_pixels} / max_pixels {self.max_pixels}: "
                f"need 0 < min_pixels <= max_pixels"
            )


@dataclass(frozen=True)
class Patches:
    """Pixels ready for the vision tower.

    pixel_values: [t * h * w, patch_dim] float32, merge-block order within each temporal group
    grid_thw:     (t, h, w) in patches: temporal groups, patch rows, patch columns
    """

    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]


def smart_resize(
    height: int,
    width: int,
    *,
    factor: int = 32,
    min_pixels: int,
    max_pixels: int,
    field: str = "image",
) -> tuple[int, int]:
    """Target (height, width): multiples of `factor`, area in bounds, aspect kept (model.md §9)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(
            f"{field} is {width}x{height}, an aspect ratio above {MAX_ASPECT_RATIO}: crop or pad it"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_size(data: bytes, *, field: str) -> tuple[int, int]:
    """(width, height) from the image's header; no pixel is decoded."""
    try:
        with Image.open(io.BytesIO(data), formats=_PIL_FORMATS) as img:
            return img.size
    except Image.DecompressionBombError:
        raise MediaTooLarge(f"{field} declares too many pixels: send a smaller image") from None
    except UnidentifiedImageError:
        raise UndecodableMedia(
            f"{field} is not a readable {'/'.join(_PIL_FORMATS)} image: check the file and "
            f"its MIME type"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise UndecodableMedia(
            f"{field} has an unreadable header ({type(exc).__name__}): send an intact file"
        ) from None


def decode_image(data: bytes, *, field: str, limits: MediaLimits) -> torch.Tensor:
    """Decode PNG/JPEG/WebP/GIF/BMP bytes to RGB uint8 [3, H, W]; alpha is composited on white.

    The pixel count is read from the header and checked before any pixel is decoded. An
    animated image contributes its first frame.
    """
    try:
        with Image.open(io.BytesIO(data), formats=_PIL_FORMATS) as img:
            width, height = img.size
            if width * height > limits.max_image_pixels:
                raise MediaTooLarge(
                    f"{field} is a {width}x{height} image ({width * height} pixels); the limit "
                    f"is {limits.max_image_pixels} pixels: send a smaller image"
                )
            img.load()
            # [H, W, 3] -> [3, H, W]: one copy out of Pillow, one transposing copy (numpy's is
            # several times faster than torch's for uint8)
            hwc = np.asarray(_to_rgb(img), dtype=np.uint8)
            chw = np.ascontiguousarray(hwc.transpose(2, 0, 1))
    except MediaError:
        raise
    except Image.DecompressionBombError:
        raise MediaTooLarge(
            f"{field} declares more pixels than {limits.max_image_pixels}: send a smaller image"
        ) from None
    except UnidentifiedImageError:
        raise UndecodableMedia(
            f"{field} is not a readable {'/'.join(_PIL_FORMATS)} image: check the file and "
            f"its MIME type"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as exc:
        raise UndecodableMedia(
            f"{field} could not be decoded ({type(exc).__name__}: the image is corrupt or "
            f"truncated): send an intact file"
        ) from None
    if min(width, height) < 1:
        raise UndecodableMedia(f"{field} is an empty {width}x{height} image")
    return torch.from_numpy(chw)


def _to_rgb(img: Image.Image) -> Image.Image:
    """The image itself when it is RGB already (the caller copies its pixels out), else RGB."""
    if img.mode == "RGB":
        return img
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def resize_bicubic(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Bicubic, antialiased resize of uint8 [T, 3, H, W] to [T, 3, height, width] (uint8)."""
    if tuple(frames.shape[-2:]) == (height, width):
        return frames
    return F.interpolate(
        frames, size=(height, width), mode="bicubic", align_corners=False, antialias=True
    )


def patchify(frames: torch.Tensor, patch: PatchConfig) -> Patches:
    """Normalise uint8 frames [T, 3, H, W] and cut them into patch vectors.

    H and W must be multiples of `patch.factor`. T is padded to a multiple of the temporal patch
    size by repeating the last frame; each pair of frames becomes one temporal group.
    Returns Patches with pixel_values [T/2 * H/16 * W/16, 1536] float32 in merge-block order.
    """
    num_frames, channels, height, width = frames.shape
    p, tp, m = patch.patch_size, patch.temporal_patch_size, patch.merge_size
    if height % patch.factor or width % patch.factor or channels != 3:
        raise ValueError(f"patchify needs [T, 3, H, W] with H, W multiples of {patch.factor}")
    if pad := -num_frames % tp:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    gt, gh, gw = frames.shape[0] // tp, height // p, width // p
    x = frames.reshape(gt, tp, channels, gh // m, m, p, gw // m, m, p)
    # -> (gt, gh/m, gw/m, m, m, C, tp, p, p): merge blocks, then (channel, temporal, py, px).
    # The reorder copies uint8 (a quarter of the float bytes); the float work then runs on
    # contiguous memory, in place: one conversion, one subtraction, one division.
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8).contiguous().to(torch.float32, copy=True)
    # same arithmetic as the reference: (x - mean * 255) / (std * 255) in float32
    mean = torch.tensor(patch.image_mean) * (1.0 / patch.rescale_factor)
    std = torch.tensor(patch.image_std) * (1.0 / patch.rescale_factor)
    x.sub_(mean.view(-1, 1, 1, 1)).div_(std.view(-1, 1, 1, 1))
    return Patches(pixel_values=x.view(gt * gh * gw, patch.patch_dim), grid_thw=(gt, gh, gw))


def image_to_patches(
    image: torch.Tensor, *, patch: PatchConfig, config: ImageConfig, field: str = "image"
) -> Patches:
    """Resize RGB uint8 [3, H, W] to the patch grid and patchify it as 2 identical frames."""
    height, width = image.shape[-2:]
    new_h, new_w = smart_resize(
        height,
        width,
        factor=patch.factor,
        min_pixels=config.min_pixels,
        max_pixels=config.max_pixels,
        field=field,
    )
    resized = resize_bicubic(image.unsqueeze(0), new_h, new_w)
    return patchify(resized.expand(patch.temporal_patch_size, -1, -1, -1), patch)
