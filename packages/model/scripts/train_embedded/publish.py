"""Copy a written checkpoint out of the training machine in files of bounded size, and put such
a copy back together.

    python3 publish.py split CHECKPOINT DEST [--max-file-bytes N]
    python3 publish.py merge DEST CHECKPOINT

`split` copies what a training run changes (config, generation config, card, training figures)
and the weights as safetensors shards of at most N bytes with their index; the tokenizer files
stay behind (runs reuse them). `merge` writes those files back into the checkpoint folder with the
shards joined into one model.safetensors, the layout the repository keeps.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import export
from safetensors.torch import load_file, save_file

COPIED = ("config.json", "generation_config.json", "README.md", "training.json")
INDEX = "model.safetensors.index.json"


def split(src: Path, dest: Path, max_file_bytes: int) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        shutil.copyfile(src / name, dest / name)
    export.save_shards(load_file(src / "model.safetensors"), dest, max_shard_bytes=max_file_bytes)


def merge(src: Path, dest: Path) -> None:
    tensors = {}
    for shard in sorted(src.glob("model-*-of-*.safetensors")):
        tensors.update(load_file(shard))
    if not tensors:
        raise FileNotFoundError(f"{src} holds no model-*-of-*.safetensors: pass a split copy")
    for name in COPIED:
        shutil.copyfile(src / name, dest / name)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / INDEX).unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("mode", choices=("split", "merge"))
    parser.add_argument("src", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--max-file-bytes", type=int, default=15_000_000)
    args = parser.parse_args()
    if args.mode == "split":
        split(args.src, args.dest, args.max_file_bytes)
    else:
        merge(args.src, args.dest)
    for path in sorted(args.dest.iterdir()):
        print(f"{path.stat().st_size:>12,}  {path}")


if __name__ == "__main__":
    main()
