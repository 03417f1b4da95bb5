"""Hub checkpoints against a local fake hub: the weights arrive, resume, and are checked."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants as hf_constants
from safetensors import safe_open
from safetensors.torch import save_file
from sparkinfer.model import embedded
from sparkinfer.model.errors import CheckpointNotFound
from sparkinfer.model.hub import fetch_checkpoint, main, missing_files
from sparkinfer.model.weights import INDEX_FILE, load_model, read_checkpoint_configs

sys.path.insert(0, str(Path(__file__).parent))
from fake_hub import FakeHub

REPO = "sparkinfer-test/embedded-sharded"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded checkpoint split into two shards and an index, as hub repos ship."""
    src = embedded.embedded_checkpoint_dir()
    dst = tmp_path_factory.mktemp("sharded")
    for p in src.iterdir():
        if p.suffix != ".safetensors" and p.is_file():
            shutil.copy(p, dst / p.name)
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        names = sorted(f.keys())
        tensors = {k: f.get_tensor(k) for k in names}
    half = len(names) // 2
    weight_map = {}
    for shard, part in zip(SHARDS, (names[:half], names[half:]), strict=True):
        save_file({k: tensors[k] for k in part}, str(dst / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (dst / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    return cache


def _online(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """What HF_ENDPOINT=hub.url does when set before huggingface_hub is imported."""
    c = hf_constants
    monkeypatch.setattr(c, "ENDPOINT", hub.url)
    template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(c, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub(sharded_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub({REPO: sharded_dir}) as h:
        _online(h, monkeypatch)
        yield h


def test_configs_alone_leave_the_weights_behind(hub: FakeHub, hub_cache: Path) -> None:
    """Why serving fetches the whole checkpoint first: the config read fetches no shard."""
    path = read_checkpoint_configs(REPO, progress=False).path
    assert set(missing_files(path)) == set(SHARDS)


def test_fetch_downloads_every_shard_and_the_model_loads(hub: FakeHub, hub_cache: Path) -> None:
    path = fetch_checkpoint(REPO, progress=False)
    assert path.is_relative_to(hub_cache)
    assert missing_files(path) == []
    model = load_model(path, device="cpu", dtype=torch.float32, progress=False)
    assert model.config.text.num_hidden_layers > 0


def test_a_cut_download_resumes_without_fetching_the_shards_it_has(
    sharded_dir: Path, hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeHub({REPO: sharded_dir}, fail_once=(SHARDS[1],)) as hub:
        _online(hub, monkeypatch)
        with pytest.raises(CheckpointNotFound, match=rf"sparkinfer\.model\.hub {REPO}"):
            fetch_checkpoint(REPO, progress=False)
        num_first = len(hub.requests)
        path = fetch_checkpoint(REPO, progress=False)
        again = [p.rsplit("/", 1)[-1] for m, p, _ in hub.requests[num_first:] if m == "GET"]
    assert missing_files(path) == []
    assert SHARDS[1] in again
    assert SHARDS[0] not in again


def test_offline_serves_a_complete_cache(
    hub: FakeHub, hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    online = fetch_checkpoint(REPO, progress=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    num_requests = len(hub.requests)
    assert fetch_checkpoint(REPO, progress=False) == online
    assert len(hub.requests) == num_requests


def test_offline_names_the_missing_shard_and_the_fetch_command(
    hub: FakeHub, hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (fetch_checkpoint(REPO, progress=False) / SHARDS[0]).unlink()
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointNotFound, match=rf"{SHARDS[0]}.*sparkinfer\.model\.hub {REPO}"):
        fetch_checkpoint(REPO, progress=False)


def test_offline_without_a_cache_names_the_fetch_command(
    hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointNotFound, match=rf"`python -m sparkinfer\.model\.hub {REPO}`"):
        fetch_checkpoint(REPO, progress=False)


def test_local_directory_missing_a_shard(sharded_dir: Path, tmp_path: Path) -> None:
    broken = shutil.copytree(sharded_dir, tmp_path / "broken")
    (broken / SHARDS[1]).unlink()
    assert missing_files(broken) == [SHARDS[1]]
    with pytest.raises(CheckpointNotFound, match=rf"lacks {SHARDS[1]}: copy them"):
        fetch_checkpoint(broken, progress=False)


def test_command_prints_the_directory(
    hub: FakeHub, hub_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([REPO]) == 0
    assert missing_files(Path(capsys.readouterr().out.strip())) == []
    assert main(["nobody/absent"]) == 1
    assert "nobody/absent" in capsys.readouterr().err
