"""Kernels tests compare bits through their conftest's fixtures, never with a raw torch.equal.

Under the Triton interpreter tl.dot is numpy's matmul, whose rounding follows the operand shapes
and the BLAS kernel the CPU picks: bit equality between computations of different shapes passes
on one machine and fails on another. The kernels conftest offers `assert_same_bits` (computations
of the same shapes, anywhere) and `assert_same_bits_across_shapes` (CUDA only: it fails under
the interpreter); raw comparisons stay allowed only inside gpu tests.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNEL_TESTS = ROOT / "packages" / "kernels" / "tests"


def _is_gpu_mark(node: ast.expr) -> bool:
    """pytest.mark.gpu, bare or called."""
    node = node.func if isinstance(node, ast.Call) else node
    return isinstance(node, ast.Attribute) and node.attr == "gpu"


def _module_is_gpu(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            value = node.value
            marks = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            if any(_is_gpu_mark(m) for m in marks):
                return True
    return False


def _is_zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0


def _raw_bit_comparison(call: ast.Call) -> str | None:
    """What a call compares bit for bit, or None."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name in ("equal", "array_equal"):
        return f"{ast.unparse(func)}(...)"
    if name == "assert_close":
        tolerances = {k.arg: k.value for k in call.keywords if k.arg in ("atol", "rtol")}
        if len(tolerances) == 2 and all(_is_zero(v) for v in tolerances.values()):
            return "assert_close(..., atol=0, rtol=0)"
    return None


def _violations(source: str, name: str) -> list[str]:
    """`name:line: call` of each raw bit comparison outside gpu tests in a test module's source."""
    tree = ast.parse(source)
    if _module_is_gpu(tree):
        return []
    found = []

    def visit(node: ast.AST, is_gpu: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            is_gpu = is_gpu or any(_is_gpu_mark(d) for d in node.decorator_list)
        if isinstance(node, ast.Call) and not is_gpu:
            what = _raw_bit_comparison(node)
            if what:
                found.append(f"{name}:{node.lineno}: {what}")
        for child in ast.iter_child_nodes(node):
            visit(child, is_gpu)

    visit(tree, False)
    return found


def test_kernel_tests_compare_bits_only_through_the_conftest_fixtures():
    paths = [p for p in sorted(KERNEL_TESTS.glob("*.py")) if p.name != "conftest.py"]
    assert paths
    found = [v for p in paths for v in _violations(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, (
        "raw bit comparisons outside gpu tests: use the fixture assert_same_bits (same shapes) "
        "or assert_same_bits_across_shapes in a gpu test (packages/kernels/tests/conftest.py):\n"
        + "\n".join(found)
    )


def test_the_scan_finds_raw_comparisons_outside_gpu_tests():
    source = (
        "import pytest, torch\n"
        "def test_a(x):\n    assert torch.equal(x, x)\n"
        "def test_b(x):\n    torch.testing.assert_close(x, x, atol=0, rtol=0)\n"
        "@pytest.mark.gpu\ndef test_c(x):\n    assert torch.equal(x, x)\n"
        "def test_d(x, assert_close):\n    assert_close(x, x)\n"
    )
    assert [v.split(":")[1] for v in _violations(source, "test_x.py")] == ["3", "5"]
