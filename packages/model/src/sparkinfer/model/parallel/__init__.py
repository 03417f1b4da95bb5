"""Tensor parallelism: one process per rank, each holding a slice of every layer.

`group.py` wraps the torch.distributed process group, `plan.py` says which heads, channels and
vocabulary rows each rank owns, `layers.py` holds the row-parallel projection and the
vocabulary-parallel embedding and head, and `sharded_model.py` builds a rank's model and fills it
from the checkpoint, reading only that rank's slices.
"""
