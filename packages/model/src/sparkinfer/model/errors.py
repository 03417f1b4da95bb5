"""Typed errors of the model package: bad config, unsupported checkpoint, bad or missing tensors."""

from __future__ import annotations


class ConfigError(ValueError):
    """config.json or generation_config.json has a missing or invalid field."""


class UnsupportedCheckpoint(ConfigError):
    """The config is valid but asks for something sparkinfer does not implement."""


class CheckpointError(ValueError):
    """The checkpoint's tensors do not match its config: missing, unexpected or wrong shape."""


class CheckpointNotFound(CheckpointError):
    """A local path does not exist, or a hub id cannot be fetched (offline, private, misspelt)."""
