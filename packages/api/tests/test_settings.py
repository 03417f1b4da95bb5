"""Settings: flags over SPARKINFER_* variables over defaults; bad or unknown values stop start."""

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest
from sparkinfer.api import settings as settings_module
from sparkinfer.api.settings import (
    ENV_ONLY,
    Settings,
    SettingsError,
    build_parser,
    env_name,
    load_settings,
    media_limits,
    parse_args,
    scheduler_config,
    server_config,
)
from sparkinfer.kernels.linear.shape_table import ShapeTable
from sparkinfer.multimodal import MediaLimits, VideoSampling
from sparkinfer.scheduler.config import HELP, SchedulerConfig

README = Path(__file__).resolve().parents[1] / "README.md"


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings(environ={})
    assert (s.host, s.port, s.model, s.max_queue_depth) == ("127.0.0.1", 8080, None, 0)


def test_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKINFER_PORT", "9000")
    monkeypatch.setenv("SPARKINFER_MAX_MODEL_LEN", "1024")
    s = load_settings()
    assert (s.port, s.max_model_len) == (9000, 1024)


def test_flags_beat_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKINFER_PORT", "9000")
    s, _ = parse_args(["--port", "9100", "--served-model-name", "m", "--enforce-eager"])
    assert (s.port, s.served_model_name, s.enforce_eager) == (9100, "m", True)


def test_invalid_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKINFER_MAX_NUM_SEQS", "zero")
    with pytest.raises(SettingsError, match="SPARKINFER_MAX_NUM_SEQS"):
        load_settings()


def test_invalid_flag_names_the_flag() -> None:
    with pytest.raises(SettingsError, match="--gpu-memory-utilization"):
        parse_args(["--gpu-memory-utilization", "1.5"])


def test_unknown_variable_stops_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKINFER_MAX_SEQS", "4")
    with pytest.raises(SettingsError, match="SPARKINFER_MAX_SEQS"):
        load_settings()


def test_api_key_is_secret() -> None:
    s = load_settings({"api_key": "sk-123"}, environ={})
    assert "sk-123" not in repr(s)


def test_readme_table_lists_every_setting() -> None:
    rows = re.findall(
        r"^\| `(SPARKINFER_[A-Z_]+)` \| (`--[a-z-]+`|\(environment only\)) \| `([^`]*)` \|",
        README.read_text(),
        re.M,
    )
    documented = {env: (flag.strip("`"), default) for env, flag, default in rows}
    assert len(documented) == len(rows), "a variable is listed twice"
    expected = {
        env_name(name): (
            "(environment only)" if name in ENV_ONLY else "--" + name.replace("_", "-"),
            _shown(info.default),
        )
        for name, info in Settings.model_fields.items()
    }
    assert documented == expected


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return str(default).lower()
    return str(default)


def test_help_lists_every_setting(capsys):
    """--help renders (descriptions may hold percent signs) and names every variable."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "docs/benchmarks.md" in out
    for name in Settings.model_fields:
        assert env_name(name) in out or name in ENV_ONLY


def test_api_key_comes_from_the_environment_or_a_file_never_a_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--api-key", "sk-visible-in-ps"])
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    s, _ = parse_args(["--api-key-file", str(key_file)])
    assert s.api_key is not None and s.api_key.get_secret_value() == "sk-from-file"
    monkeypatch.setenv("SPARKINFER_API_KEY", "sk-env")
    with pytest.raises(SettingsError, match="give the key one way"):
        parse_args(["--api-key-file", str(key_file)])
    s, _ = parse_args([])
    assert s.api_key is not None and s.api_key.get_secret_value() == "sk-env"
    monkeypatch.delenv("SPARKINFER_API_KEY")
    with pytest.raises(SettingsError, match="cannot be read"):
        parse_args(["--api-key-file", str(tmp_path / "missing")])


ENGINE_KNOBS = sorted(
    set(Settings.model_fields) & {f.name for f in dataclasses.fields(SchedulerConfig)}
)
OWN_DEFAULT = {
    "max_model_len"
}  # unset: the checkpoint's context, which SchedulerConfig cannot know


def test_engine_knobs_are_declared_once_in_the_scheduler_config() -> None:
    """Every setting that is also a SchedulerConfig field takes its default, description, type
    and rule from there: its declaration in settings.py is `engine_setting(name)`, with no
    default, description or constraint of its own."""
    tree = ast.parse(Path(settings_module.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    declared = {
        st.target.id: st.value
        for st in cls.body
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value
    }
    hints = typing.get_type_hints(SchedulerConfig, localns={"ShapeTable": ShapeTable})
    specs = {f.name: f for f in dataclasses.fields(SchedulerConfig)}
    assert len(ENGINE_KNOBS) >= 15
    for name in ENGINE_KNOBS:
        info = Settings.model_fields[name]
        assert not info.metadata, f"{name}: its rule belongs in SchedulerConfig.__post_init__"
        if name in OWN_DEFAULT:
            continue
        value = declared[name]
        assert (
            isinstance(value, ast.Call)
            and ast.unparse(value.func) == "engine_setting"
            and [ast.literal_eval(a) for a in value.args] == [name]
        ), f"{name} declares its own default: use engine_setting({name!r})"
        assert (
            info.default == specs[name].default and info.description == specs[name].metadata[HELP]
        )
        assert info.annotation == hints[name], name


def test_settings_build_the_scheduler_config() -> None:
    s = load_settings({"block_size": 128, "speculative": "ngram"}, environ={})
    cfg = scheduler_config(s, max_model_len=4096, eos_token_ids=(2,))
    assert (cfg.block_size, cfg.speculative, cfg.max_model_len, cfg.eos_token_ids) == (
        128, "ngram", 4096, (2,),
    )  # fmt: skip
    assert scheduler_config(load_settings({"max_model_len": 512}, environ={})).max_model_len == 512
    defaults = scheduler_config(load_settings(environ={}))
    assert dataclasses.replace(defaults, max_model_len=SchedulerConfig().max_model_len) == (
        SchedulerConfig()
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--block-size", "48"], r"--block-size: block_size is 48; it must be a power of two"),
        (["--num-speculative-tokens", "17"], r"--num-speculative-tokens: .* 1 to 16"),
        (["--max-model-len", "0"], r"--max-model-len: max_model_len is 0"),
        (["--gpu-memory-utilization", "1.5"], r"--gpu-memory-utilization: .*in \(0, 1\]"),
    ],
)
def test_engine_rules_stop_start_up_naming_the_flag(flags: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_args(flags)


def test_engine_rule_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKINFER_BLOCK_SIZE", "24")
    with pytest.raises(SettingsError, match="SPARKINFER_BLOCK_SIZE: block_size is 24"):
        load_settings()


def test_media_limits_are_declared_once_in_media_limits() -> None:
    """The media settings take MediaLimits' defaults, and a setting reaches its field."""
    assert media_limits(load_settings(environ={})) == MediaLimits()
    limits = media_limits(load_settings({"video_max_seconds": 5.0}, environ={}))
    assert limits == MediaLimits(max_video_seconds=5.0)
    with pytest.raises(SettingsError, match="--media-max-bytes"):
        load_settings({"media_max_bytes": 0}, environ={})
    defaults = load_settings(environ={})
    assert (defaults.video_fps, defaults.video_max_frames) == (
        VideoSampling.fps,
        VideoSampling.max_frames,
    )


def test_settings_build_one_frozen_server_config_tree() -> None:
    """Each branch of the tree carries its settings; the tree and its branches are frozen."""
    s = load_settings(
        {
            "keep_alive_s": 3.0,
            "max_stored_responses": 7,
            "video_max_frames": 8,
            "block_size": 128,
            "max_body_bytes": 4096,
            "port": 0,
            "mrope": False,
            "data_dir": "/tmp/x",
        },
        environ={},
    )
    config = server_config(s)
    assert config.requests.keep_alive_s == 3.0
    assert config.store.limits.max_responses == 7 and str(config.store.data_dir) == "/tmp/x"
    assert config.media.video.max_frames == 8 and not config.media.use_mrope
    assert config.engine == scheduler_config(s) and config.engine.block_size == 128
    assert config.edge.max_body_bytes == 4096 and not config.edge.api_keys
    assert config.listen.port == 0 and config.model.model is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.requests.keep_alive_s = 1.0  # type: ignore[misc]
