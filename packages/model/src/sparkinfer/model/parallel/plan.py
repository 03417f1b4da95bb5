"""Which slice of each layer a tensor-parallel rank owns (docs/scaling.md, "Tensor parallel").

- Full attention: the query heads split evenly. The KV heads split evenly too when the size
  divides them; when the size is a multiple of them instead, each KV head is replicated on the
  size / num_kv_heads ranks whose query heads read it (27B's 24 q / 4 kv heads at size 8: three
  query heads and one KV head per rank, each KV head on two ranks).
- Gated-DeltaNet: split by key-head group: a rank owns whole key heads and the value heads that
  read them, so its conv channels and recurrent state rows are its heads' alone.
- MLP: the intermediate columns split evenly.
- Embedding and LM head: the vocabulary rows split into equal shards (the last one padded).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sparkinfer.model.config import TextConfig
from sparkinfer.model.errors import ConfigError


def _even_split(name: str, value: int, size: int) -> int:
    if value % size:
        raise ConfigError(
            f"text_config.{name} is {value}; tensor_parallel_size {size} does not divide it: "
            "pick a tensor_parallel_size that divides it"
        )
    return value // size


@dataclass(frozen=True)
class ShardPlan:
    """The slices of rank `rank` of `size`; ranges are [start, end) in the full model's heads."""

    text: TextConfig
    rank: int
    size: int

    def __post_init__(self) -> None:
        t, n = self.text, self.size
        _even_split("num_attention_heads", t.num_attention_heads, n)
        if t.num_key_value_heads % n and n % t.num_key_value_heads:
            raise ConfigError(
                f"text_config.num_key_value_heads is {t.num_key_value_heads}; tensor_parallel_size "
                f"{n} neither divides it nor is a multiple of it: pick a size that does either"
            )
        _even_split("linear_num_key_heads", t.linear_num_key_heads, n)
        _even_split("intermediate_size", t.intermediate_size, n)

    def _range(self, total: int) -> range:
        per_rank = total // self.size
        return range(self.rank * per_rank, (self.rank + 1) * per_rank)

    @property
    def q_heads(self) -> range:
        return self._range(self.text.num_attention_heads)

    @property
    def kv_heads(self) -> range:
        """This rank's KV heads: its own share, or the one KV head its query heads read."""
        t = self.text
        if t.num_key_value_heads % self.size == 0:
            return self._range(t.num_key_value_heads)
        kv = self.rank * t.num_key_value_heads // self.size
        return range(kv, kv + 1)

    @property
    def k_heads(self) -> range:
        """Gated-DeltaNet key heads."""
        return self._range(self.text.linear_num_key_heads)

    @property
    def v_heads(self) -> range:
        """Gated-DeltaNet value heads: those that read this rank's key heads."""
        return self._range(self.text.linear_num_value_heads)

    @property
    def intermediate(self) -> range:
        return self._range(self.text.intermediate_size)

    @property
    def vocab_shard_len(self) -> int:
        return -(-self.text.vocab_size // self.size)

    @property
    def vocab(self) -> range:
        """This rank's vocabulary rows; the last shard may be short (its tail rows are padding)."""
        start = self.rank * self.vocab_shard_len
        return range(start, min(self.text.vocab_size, start + self.vocab_shard_len))

    def local_text(self) -> TextConfig:
        """The config a rank builds its layers from: its own head and column counts."""
        t = self.text
        return dataclasses.replace(
            t,
            num_attention_heads=len(self.q_heads),
            num_key_value_heads=len(self.kv_heads),
            linear_num_key_heads=len(self.k_heads),
            linear_num_value_heads=len(self.v_heads),
            intermediate_size=len(self.intermediate),
        )
