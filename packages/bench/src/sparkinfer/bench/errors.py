"""Typed errors of the bench CLI: each one ends the run with a message and exit code 2."""


class BenchError(Exception):
    """Base of every error the CLI reports without a traceback."""


class UsageError(BenchError, ValueError):
    """A flag value the benchmark cannot use (names the flag, the value and the limit)."""


class DatasetError(BenchError, ValueError):
    """A prompt dataset or shipped data file that cannot be read."""


class ServerError(BenchError, RuntimeError):
    """The server is unreachable or answers something that is not an OpenAI-compatible response."""


class DeviceError(BenchError, RuntimeError):
    """A benchmark that needs a CUDA device found none, or the device ran out of memory."""
