"""Makes the helpers in scheduler_testing.py importable (tests run with --import-mode=importlib)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from scheduler_testing import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model():
    return build_tiny_model()
