"""A whole checkpoint on local disk before serving: hub weights fetched, every file checked.

`fetch_checkpoint` is what serving calls first. A local directory is only checked. A hub id has
all its checkpoint files (configs, tokenizer, safetensors shards) downloaded through
huggingface_hub into its cache (`HF_HOME`/`HF_HUB_CACHE`; `/models` in the server image) with a
progress bar; a download cut short resumes from its partial files on the next run. With
`HF_HUB_OFFLINE=1` (the image's `SPARKINFER_NO_DOWNLOAD=1`) or no network, a cached snapshot is
used as it is. Either way the directory is then checked against its safetensors index, and a
missing file is an error naming it and the command that fetches it:

    python -m sparkinfer.model.hub MODEL    # fetch only, no serving (the image: `download MODEL`)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sparkinfer.model.errors import CheckpointError, CheckpointNotFound
from sparkinfer.model.weights import (
    CHECKPOINT_PATTERNS,
    INDEX_FILE,
    SINGLE_FILE,
    resolve_checkpoint,
)

CONFIG_FILE = "config.json"
_MAX_SHOWN = 8  # missing files quoted in one message


def fetch_command(model: str) -> str:
    """The shell command that fetches `model`'s files without serving it."""
    return f"python -m sparkinfer.model.hub {model}"


def missing_files(path: Path) -> list[str]:
    """Files the checkpoint directory lacks: config.json, then the index's shards or the
    single model.safetensors (the weights named nowhere when neither the index nor it exist)."""
    missing = [] if (path / CONFIG_FILE).is_file() else [CONFIG_FILE]
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index} has no valid weight_map ({e}): re-download it") from e
        return missing + [s for s in shards if not (path / s).is_file()]
    if not (path / SINGLE_FILE).is_file():
        missing.append(f"{SINGLE_FILE} (or {INDEX_FILE} and its shards)")
    return missing


def fetch_checkpoint(path_or_id: str | Path, *, progress: bool = True) -> Path:
    """The local directory of a complete checkpoint: `path_or_id` itself, or a hub id's snapshot
    with every checkpoint file downloaded. Raises CheckpointNotFound naming what is missing."""
    path = resolve_checkpoint(path_or_id, allow_patterns=CHECKPOINT_PATTERNS, progress=progress)
    missing = missing_files(path)
    if missing:
        shown = ", ".join(missing[:_MAX_SHOWN])
        more = f" and {len(missing) - _MAX_SHOWN} more" if len(missing) > _MAX_SHOWN else ""
        how = (
            f"fetch them with `{fetch_command(str(path_or_id))}` where the hub is reachable"
            if str(path_or_id) != str(path)
            else "copy them into that directory or pass a complete checkpoint"
        )
        raise CheckpointNotFound(f"{path} lacks {shown}{more}: {how}")
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m sparkinfer.model.hub MODEL`: fetch and check MODEL, print its directory."""
    parser = argparse.ArgumentParser(
        prog="python -m sparkinfer.model.hub",
        description="Download a checkpoint's files from the Hugging Face hub into its cache "
        "(HF_HOME) and check them against the index; prints the local directory.",
    )
    parser.add_argument("model", help="hub repo id (owner/name) or a local checkpoint directory")
    args = parser.parse_args(argv)
    try:
        path = fetch_checkpoint(args.model)
    except (CheckpointNotFound, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
