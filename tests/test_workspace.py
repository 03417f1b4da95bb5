"""Workspace-wide rules: the import direction of STYLE.md and each package's layout."""

import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ["kernels", "model", "scheduler", "multimodal", "api", "bench"]


def test_import_direction_follows_style_table():
    # import-linter's layers and forbidden contracts live in the root pyproject.toml.
    result = subprocess.run(
        [sys.executable, "-m", "importlinter.cli", "--config", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if result.returncode != 0:
        # Fall back to the console script when the module entry point is absent.
        result = subprocess.run(
            ["lint-imports", "--config", str(ROOT / "pyproject.toml")],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_package_follows_the_layout():
    for name in PACKAGES:
        pkg = ROOT / "packages" / name
        meta = tomllib.loads((pkg / "pyproject.toml").read_text())
        assert meta["project"]["name"] == f"sparkinfer-{name}"
        assert meta["tool"]["uv"]["build-backend"]["module-name"] == f"sparkinfer.{name}"
        assert (pkg / "src" / "sparkinfer" / name / "__init__.py").is_file()
        assert not (pkg / "src" / "sparkinfer" / "__init__.py").exists(), "sparkinfer is a namespace"
        assert (pkg / "README.md").is_file()
        assert (pkg / "tests").is_dir()


def test_each_package_imports_on_its_own():
    for name in PACKAGES:
        code = f"import sparkinfer.{name}"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
