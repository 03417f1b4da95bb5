"""The `sparkinfer-api` command: help with defaults, and each start-up mistake as one line
before the model loads (the port bound first, torch not even imported for the cheap ones)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants as hf_constants
from sparkinfer.api import cli
from sparkinfer.api import main as main_module

# Runs the command in a fresh interpreter, then says whether torch was imported before it ended.
_COMMAND = (
    "import sys\n"
    "from sparkinfer.api.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "finally:\n"
    "    print('torch imported:', 'torch' in sys.modules)\n"
)


def _command(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _COMMAND, *argv], capture_output=True, text=True, timeout=120
    )


def _one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith("sparkinfer-api: ")
    return stderr


def test_help_shows_defaults_and_variables_without_importing_torch() -> None:
    result = _command("--help")
    assert result.returncode == 0
    assert "[default 8080; SPARKINFER_PORT]" in " ".join(result.stdout.split())
    assert "[default off; SPARKINFER_DETERMINISTIC]" in " ".join(result.stdout.split())
    assert result.stdout.endswith("torch imported: False\n")


def test_a_mistyped_flag_is_one_line_without_importing_torch() -> None:
    result = _command("--prot", "8000")
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert "unrecognized arguments: --prot 8000" in line and "--help` lists the flags" in line
    assert result.stdout == "torch imported: False\n"


def test_a_taken_port_is_one_line_before_anything_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _command("--port", str(port), "--device", "cpu")
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "pass another --port" in line
    assert result.stdout == "torch imported: False\n"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--host", "203.0.113.7"], "is not one of this machine's: pass --host 127.0.0.1"),
        (["--host", "no-such-host.invalid"], "the host does not resolve"),
        (["--port", "70000"], "--port='70000': Input should be less than or equal to 65535"),
        (["--max-num-seqs", "-3"], "--max-num-seqs"),
    ],
    ids=["foreign-address", "unknown-host", "port-out-of-range", "bad-value"],
)
def test_a_bad_address_or_value_is_one_line_before_anything_loads(
    argv: list[str], expected: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(main_module, "serve", pytest.fail)  # the model never loads
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--device", "cpu"])
    assert info.value.code == 2
    assert expected in _one_line(capsys.readouterr().err)


def test_the_port_is_bound_before_the_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve gets a socket already bound to the port (refusing connections until it listens)."""
    seen = []
    monkeypatch.setattr(main_module, "serve", lambda _, sock: seen.append(sock.getsockname()))
    cli.main(["--port", "0", "--device", "cpu"])
    assert seen[0][0] == "127.0.0.1" and seen[0][1] > 0


def test_a_missing_model_folder_is_one_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--model", "/nonexistent", "--port", "0", "--device", "cpu"])
    assert info.value.code == 2
    line = _one_line(capsys.readouterr().err)
    assert "/nonexistent is neither an existing directory nor a hub repo id" in line


def test_a_hub_id_without_network_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # A hub nobody answers at (connection refused), and an empty cache.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setattr(hf_constants, "ENDPOINT", url)
    template = url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(SystemExit) as info:
        cli.main(["--model", "sparkinfer-test/absent", "--port", "0", "--device", "cpu"])
    assert info.value.code == 2
    line = _one_line(capsys.readouterr().err)
    assert "cannot fetch 'sparkinfer-test/absent'" in line
    assert "python -m sparkinfer.model.hub sparkinfer-test/absent" in line
