from sparkinfer.bench.roofline import vision_flops
from sparkinfer.bench.vision import VISION_27B


def test_vision_flops_from_spec_parameter_counts():
    """448x448 image (docs/model.md §9 example 1): 784 patches, 196 tokens, one segment of 784."""
    patch_embed, block, merger = 1536 * 1152, 15_224_832, 44_826_624  # model.md §2, no biases/norms
    want = 2 * 784 * (patch_embed + 27 * block) + 2 * 196 * merger + 27 * 4 * 784**2 * 1152
    assert vision_flops(VISION_27B, [(1, 28, 28)]) == want


def test_vision_flops_video_attends_per_frame_group():
    one = vision_flops(VISION_27B, [(1, 28, 28)])
    assert vision_flops(VISION_27B, [(6, 28, 28)]) == 6 * one
