"""The Qwen3.8 text model: hybrid Gated-DeltaNet / gated-attention stack and untied LM head.

Parameter names follow the text-only checkpoint layout (`model.*`, `lm_head.weight`), so loading
is a near-identity map (weights.py strips `language_model.` from the multimodal layout).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
from sparkinfer.model.cache_spec import (
    AttentionCacheSpec,
    CacheSpec,
    LinearStateSpec,
    ModelCaches,
)
from sparkinfer.model.config import LINEAR_ATTENTION, ModelConfig, TextConfig
from sparkinfer.model.errors import ConfigError
from sparkinfer.model.forward_batch import ForwardBatch, VerifyLayout
from sparkinfer.model.layers import KernelOps, select_ops
from sparkinfer.model.layers.attention import GatedAttention
from sparkinfer.model.layers.embedding import Embedding, LMHead
from sparkinfer.model.layers.gated_deltanet import GatedDeltaNet
from sparkinfer.model.layers.mlp import MLP
from sparkinfer.model.layers.norm import RMSNorm
from sparkinfer.model.layers.rotary import RotaryEmbedding
from sparkinfer.model.mtp import MTPHead
from sparkinfer.model.vision import VisionModel
from torch import nn


class TappedOutput(NamedTuple):
    """`forward_tapped`'s result: the usual output and the tapped layers' hidden states."""

    hidden: torch.Tensor  # [T, hidden], or [N, hidden] with logits_rows_only
    tapped: torch.Tensor  # [T, len(tap_layers) * hidden], concatenated in tap_layers order


# The GDN gates, computed in fp32, and FP8 layers' block scales: kept in fp32 by `.to(dtype)`.
_FP32_PARAMETERS = frozenset({"A_log", "dt_bias", "weight_scale_inv"})


class DecoderLayer(nn.Module):
    """x = x + mixer(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x))."""

    def __init__(
        self,
        config: TextConfig,
        layer_idx: int,
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        dims = {"ops": ops, "device": device, "dtype": dtype}
        self.is_linear = config.layer_types[layer_idx] == LINEAR_ATTENTION
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config, layer_idx, **dims)
        else:
            self.self_attn = GatedAttention(config, layer_idx, **dims)
        self.mlp = MLP(config.hidden_size, config.intermediate_size, **dims)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **dims)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **dims)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        output_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) -> (mlp output, residual stream); the add is fused into the next norm.

        output_rows: the rows to return (None: all). The mixer still runs over every row, since
        it writes every token's KV or state, but only these rows go on to its output projection
        and the MLP.
        """
        # An FP8 projection after a norm takes its input quantized by the norm's kernel (h_fp8).
        if self.is_linear:
            mixer = self.linear_attn
            h, stream, h_fp8 = self.input_layernorm.forward_for(mixer.in_proj, x, residual)
            h = mixer(h, batch, output_rows, h_fp8)
        else:
            mixer = self.self_attn
            h, stream, h_fp8 = self.input_layernorm.forward_for(mixer.qkv_proj, x, residual)
            h = mixer(h, *rope, batch, output_rows, h_fp8)
        if output_rows is not None:
            stream = stream[output_rows]
        h, stream, h_fp8 = self.post_attention_layernorm.forward_for(
            self.mlp.gate_up_proj, h, stream
        )
        return self.mlp(h, h_fp8), stream


class TextModel(nn.Module):
    """Embedding, decoder layers and final norm (`model.*` in the checkpoint)."""

    def __init__(
        self, config: TextConfig, *, ops: KernelOps, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.embed_tokens = Embedding(
            config.vocab_size, config.hidden_size, device=device, dtype=dtype
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, ops=ops, device=device, dtype=dtype)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, ops=ops, device=device, dtype=dtype
        )
        self.rotary_emb = RotaryEmbedding(
            config.rotary_dim, config.rope_theta, config.mrope_section, device=device
        )

    def forward(
        self,
        h: torch.Tensor,
        batch: ForwardBatch,
        output_rows: torch.Tensor | None = None,
        tap_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h [T, hidden] input embeddings -> (final-normed hidden states [T, hidden], or
        [N, hidden] at `output_rows` (the last layer then projects and runs its MLP on those
        rows only); the tapped states [T, len(tap_layers) * hidden], None without taps).

        Tap i is the residual stream after layer i (-1: the embeddings), what transformers'
        `hidden_states[i + 1]` holds, except that the last layer's tap is its final-normed
        output as there. The decoder fuses each residual add into the next norm, so a tap costs
        one add of [T, hidden]; with no taps nothing is added.
        """
        taps: dict[int, torch.Tensor] = {-1: h} if -1 in tap_layers else {}
        rope = self.rotary_emb(batch.positions)
        residual = None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h, residual = layer(h, residual, rope, batch, output_rows if i == last else None)
            if i in tap_layers and i != last:
                taps[i] = h + residual
        h, _ = self.norm(h, residual)
        if not tap_layers:
            return h, None
        if last in tap_layers:
            taps[last] = h
        return h, torch.cat([taps[i] for i in tap_layers], dim=-1)


class Qwen3_8ForCausalLM(nn.Module):
    """The Qwen3.8 language model over a packed `ForwardBatch` (see docs/contracts.md).

    Args:
        config: the checkpoint's config.
        device, dtype: where and how the weights live; A_log and dt_bias stay fp32. A CUDA device
            selects the Triton kernels, any other the plain-torch references.
        num_real_tokens: ids at or above this are padding and get -inf logits; the tokenizer's
            length when known, else the config's vocab_size (nothing masked).
        use_vision: build the vision tower (`visual`) when the config has a `vision_config`; the
            engine runs it on a request's media and merges its rows into `embed_input_ids`.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        device: torch.device | str,
        dtype: torch.dtype,
        num_real_tokens: int | None = None,
        use_vision: bool = True,
    ) -> None:
        super().__init__()
        text = config.text
        vocab = text.vocab_size
        if num_real_tokens is not None and not 0 < num_real_tokens <= vocab:
            raise ConfigError(
                f"num_real_tokens is {num_real_tokens}; it must be in [1, vocab_size={vocab}]: "
                "pass the tokenizer's length"
            )
        self.config = config
        self.dtype = dtype
        device = torch.device(device)
        self.ops = select_ops(use_triton=device.type == "cuda")
        self.model = TextModel(text, ops=self.ops, device=device, dtype=dtype)
        self.lm_head = LMHead(
            vocab,
            text.hidden_size,
            num_real_tokens=num_real_tokens or vocab,
            ops=self.ops,
            device=device,
            dtype=dtype,
        )
        if text.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.mtp: MTPHead | None = None  # speculative decoding's drafter, when `attach_mtp` ran
        # layers whose hidden states `forward_tapped` returns beside the output (a block drafter's)
        self.tap_layers: tuple[int, ...] = ()
        self.visual: VisionModel | None = None
        if use_vision and config.vision is not None:
            if config.vision.out_hidden_size != text.hidden_size:
                raise ConfigError(
                    f"vision_config.out_hidden_size is {config.vision.out_hidden_size}; the text "
                    f"model's hidden_size is {text.hidden_size}: they must be equal"
                )
            self.visual = VisionModel(config.vision, device=device, dtype=dtype)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        """`.to(device)`, `.to(dtype)` and friends.

        The kernels follow the weights (Triton on CUDA only); the fp32 gate parameters (A_log,
        dt_bias), FP8 weights and their scales follow a device move but keep their dtype; the
        caches take the new dtype.
        """
        kept = [
            (module, name, param)
            for module in self.modules()
            for name, param in list(module._parameters.items())
            if param is not None
            and (name in _FP32_PARAMETERS or param.dtype == torch.float8_e4m3fn)
        ]
        for module, name, _ in kept:
            del module._parameters[name]
        try:
            super()._apply(fn, recurse)
        finally:
            device = self.lm_head.weight.device
            for module, name, param in kept:
                moved = param.detach().to(device)
                module._parameters[name] = nn.Parameter(moved, requires_grad=param.requires_grad)
        self.dtype = self.lm_head.weight.dtype
        use_triton = device.type == "cuda"
        if use_triton != self.ops.is_triton:
            self.use_ops(select_ops(use_triton=use_triton))
        return self

    def use_ops(self, ops: KernelOps) -> None:
        """Run every layer on `ops` (e.g. the torch references on a GPU, to compare speed)."""
        self.ops = ops
        for module in self.modules():
            if module is not self and hasattr(module, "ops"):
                # torch types Module attributes as Tensor | Module; ops is neither.
                setattr(module, "ops", ops)  # noqa: B010

    def attach_mtp(self, tensors: Mapping[str, torch.Tensor]) -> MTPHead:
        """Build the MTP head (`mtp.py`) from the checkpoint's `mtp.*` tensors and keep it as
        `mtp`; from then on `cache_spec` includes its KV."""
        head = MTPHead(
            self.config.text, ops=self.ops, device=self.lm_head.weight.device, dtype=self.dtype
        )
        head.load_weights(tensors)
        self.mtp = head
        return head

    @property
    def has_vision(self) -> bool:
        """Whether the model has a vision tower, i.e. takes image and video input."""
        return self.visual is not None

    def cache_spec(self) -> CacheSpec:
        """KV for each full-attention layer (and the MTP head's layer when attached), conv + fp32
        recurrent state for each GDN layer."""
        text = self.config.text
        attention = tuple(
            AttentionCacheSpec(i, text.num_key_value_heads, text.head_dim, self.dtype)
            for i in text.full_attention_layers
        )
        linear = tuple(
            LinearStateSpec(
                layer_idx=i,
                conv_dim=text.linear_conv_dim,
                conv_len=text.linear_conv_kernel_dim - 1,
                num_v_heads=text.linear_num_value_heads,
                k_head_dim=text.linear_key_head_dim,
                v_head_dim=text.linear_value_head_dim,
                conv_dtype=self.dtype,
                state_dtype=torch.float32,
            )
            for i in text.linear_attention_layers
        )
        if self.mtp is not None:
            attention = (*attention, self.mtp.cache_spec(self.dtype))
        return CacheSpec(attention=attention, linear=linear)

    def kernel_warmup_lengths(self, max_tokens: int) -> tuple[int, ...]:
        """Lengths of one-sequence prompt chunks whose forwards, run once each, build every
        kernel variant that steps of up to `max_tokens` tokens take, so that no request waits
        on a build (about 1.5-2 s each on an H200).

        Only the attention prefill kernel picks variants by a step's size
        (`prefill_variant_lengths`); the other kernels build one for every size. Empty on the
        reference ops or without full-attention layers.
        """
        text = self.config.text
        if not self.ops.is_triton or not text.full_attention_layers:
            return ()
        from sparkinfer.kernels.paged_attention.prefill import prefill_variant_lengths

        return prefill_variant_lengths(
            text.num_attention_heads,
            text.num_key_value_heads,
            text.head_dim,
            max_tokens,
            self.lm_head.weight.device,
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] int64 -> [T, hidden]; the caller merges vision features into these
        (`vision.merge_vision_embeddings` with the rows of `visual(pixel_values, grid_thw)`)."""
        return self.model.embed_tokens(input_ids)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        batch: ForwardBatch,
        *,
        inputs_embeds: torch.Tensor | None = None,
        logits_rows_only: bool = False,
    ) -> torch.Tensor:
        """input_ids [T] int64 (or inputs_embeds [T, hidden]) -> hidden [T, hidden], or with
        `logits_rows_only` hidden [N, hidden] at `batch.logits_indices`.

        Writes the new tokens' KV and each sequence's GDN state into `batch.caches`. With
        `logits_rows_only` the last layer's output projection and MLP run on the N logits rows
        instead of all T (a prompt chunk that samples nothing skips them), the same values row
        for row as `forward(...)[batch.logits_indices]` up to the matmuls' row-count rounding.
        """
        h = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        hidden, _ = self.model(h, batch, batch.logits_indices if logits_rows_only else None)
        return hidden

    def set_tap_layers(self, layer_ids: tuple[int, ...]) -> None:
        """Choose, once, the layers whose hidden states `forward_tapped` returns (a block
        drafter's `target_layer_ids`): -1 is the embeddings, i the residual stream after layer i
        (the last layer: its final-normed output)."""
        num_layers = self.config.text.num_hidden_layers
        bad = [i for i in layer_ids if not -1 <= i < num_layers]
        if bad or len(set(layer_ids)) != len(layer_ids):
            raise ConfigError(
                f"tap layers {list(layer_ids)} must be distinct and in [-1, {num_layers - 1}]: "
                f"the model has {num_layers} layers"
            )
        self.tap_layers = tuple(layer_ids)

    @torch.inference_mode()
    def forward_tapped(
        self,
        input_ids: torch.Tensor,
        batch: ForwardBatch,
        *,
        inputs_embeds: torch.Tensor | None = None,
        logits_rows_only: bool = False,
    ) -> TappedOutput:
        """`forward`, plus the hidden states of `tap_layers` at every token, in the same pass:
        TappedOutput(hidden as `forward` returns it, tapped [T, len(tap_layers) * hidden]).

        With `logits_rows_only` the last layer runs on the logits rows only, so it cannot be
        tapped then (the taps of the other layers still cover all T tokens).
        """
        if not self.tap_layers:
            raise ConfigError("no tap layers are set: call set_tap_layers first")
        last = self.config.text.num_hidden_layers - 1
        if logits_rows_only and last in self.tap_layers:
            raise ConfigError(
                f"layer {last} is tapped, so it must run on every token: pass "
                "logits_rows_only=False"
            )
        h = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        rows = batch.logits_indices if logits_rows_only else None
        hidden, tapped = self.model(h, batch, rows, self.tap_layers)
        assert tapped is not None, "taps are set"
        return TappedOutput(hidden, tapped)

    @torch.inference_mode()
    def commit_verify(
        self, caches: ModelCaches, verify: VerifyLayout, num_kept: torch.Tensor
    ) -> None:
        """After a verify step over `verify`'s rows: advance each sequence's GDN state (every
        layer's conv window and recurrent state) by its first num_kept[i] positions, the input
        token and the accepted drafts; the verify itself left the states as they were. KV needs
        nothing: rows past the accepted ones lie beyond the context the next step reads.
        num_kept: [B] int64 on the device (0: the state stays)."""
        for layer in self.model.layers:
            gdn = getattr(layer, "linear_attn", None)
            if isinstance(gdn, GatedDeltaNet):
                gdn.commit_verify(caches.linear[gdn.layer_idx], verify, num_kept)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab_size] fp32, padded ids set to -inf."""
        return self.lm_head(hidden)
