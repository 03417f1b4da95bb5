"""Start-up tuning of a CUDA model's prompt GEMMs (`kernels.linear.TunedGemms`), then the model
runs its linear layers through the tuned choices.

Only the model's own `Linear` layers (every decoder projection) take part: the LM head runs on a
step's last rows and the vision tower on its own layers. Models without kernel ops (test fakes,
CPU references) are left as they are.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch
from sparkinfer.kernels.linear.tuned_gemm import TunedGemms
from sparkinfer.model.layers import KernelOps
from sparkinfer.model.layers.linear import Linear
from sparkinfer.scheduler.config import SchedulerConfig

logger = logging.getLogger(__name__)


def tune_prompt_gemms(
    model: object, config: SchedulerConfig, device: torch.device
) -> TunedGemms | None:
    """Tune the model's linear shapes up to the step's token budget and switch its ops to the
    tuned GEMMs; None where nothing was tuned (off, deterministic, CPU, or no kernel ops)."""
    ops = getattr(model, "ops", None)
    use_ops = getattr(model, "use_ops", None)
    if not (config.tune_gemms and not config.deterministic and device.type == "cuda"):
        return None
    if not isinstance(model, torch.nn.Module) or not isinstance(ops, KernelOps):
        return None
    if not ops.is_triton or use_ops is None:
        return None
    weights = [m.weight for m in model.modules() if isinstance(m, Linear)]
    if not weights or weights[0].dtype not in (torch.bfloat16, torch.float16):
        return None
    tuned = TunedGemms(device)
    max_rows = min(config.max_num_batched_tokens, config.max_model_len)
    shapes = {(w.shape[0], w.shape[1]) for w in weights}
    logger.info(
        "tuning %d GEMM shapes at %s rows (SPARKINFER_TUNE_GEMMS=false skips this)",
        len(shapes), tuned.row_buckets(max_rows),
    )  # fmt: skip
    start = time.perf_counter()
    results = tuned.tune(shapes, max_rows=max_rows, dtype=weights[0].dtype)
    saved = sum(r.linear_ms - r.best_ms for r in results)
    logger.info("tuned GEMMs in %.1f s: %.2f ms less over the shapes timed",
                time.perf_counter() - start, saved)  # fmt: skip
    use_ops(dataclasses.replace(ops, linear=tuned.linear, linear_swiglu=tuned.linear_swiglu))
    return tuned
