import importlib
import json
import sys

import pytest
import torch
from sparkinfer.bench.timing import Timing
from sparkinfer.lab.__main__ import main
from sparkinfer.lab.kernels import KernelBenchArgs, KernelSkipped, bench, discover, load
from sparkinfer.lab.kernels._cli import run_alone, standalone_parser


def _fast(args):
    return [
        {"op": "demo", "impl": "fast", "shape": "T=4", "median_ms": 0.1},
        {"op": "demo", "impl": "ref", "shape": "T=4", "median_ms": 1.0, "GB/s": 3.0},
    ]


def _skip(args):
    raise KernelSkipped("baseline library absent")


def _boom(args):
    raise RuntimeError("bad launch")


def test_bench_renders_rows_skips_and_failures():
    args = KernelBenchArgs(torch.device("cpu"), 0, 1, True)
    tables, failed = bench({"a": _fast, "b": _skip, "c": _boom, "d": "import failed: X"}, args)
    assert tables[0].columns == ["op", "impl", "shape", "median_ms", "GB/s"]
    assert tables[0].rows[0][-1] is None and tables[0].rows[1][-1] == 3.0
    assert "skipped: baseline library absent" in tables[1].rows[0][0]
    assert failed == ["c", "d"]


def test_the_registry_names_every_benchmark_module_and_each_loads():
    import pkgutil

    from sparkinfer.lab import kernels
    from sparkinfer.lab.kernels.registry import REGISTRY

    modules = {m.name for m in pkgutil.iter_modules(kernels.__path__)}
    benchmarks = {m for m in modules if not m.startswith("_") and not m.endswith("_tune")}
    assert benchmarks - {"registry"} == {op.module for op in REGISTRY.values()}
    names = discover()
    assert names == sorted(REGISTRY)
    loaded = load(names)
    assert all(callable(fn) for fn in loaded.values()), loaded


def test_kernels_without_cuda_exits_2(tmp_path, capsys):
    if torch.cuda.is_available():
        return
    assert main(["kernels", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_unknown_kernel_name_exits_2(tmp_path, capsys):
    assert main(["kernels", "--device", "cpu", "--only", "nope", "--out", str(tmp_path)]) == 2
    assert "--only names ['nope']" in capsys.readouterr().err


def test_run_alone_prints_one_table_titled_by_the_doc(capsys):
    cli = standalone_parser("Demo benchmark.\n\nDetails.", warmup=3, iters=7).parse_args([])
    assert (cli.warmup, cli.iters, cli.quick) == (3, 7, False)
    run_alone(_fast, cli, "Demo benchmark.\n\nDetails.")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Demo benchmark."
    assert lines[2].split() == ["op", "impl", "shape", "median_ms", "GB/s"]


def test_every_kernel_module_takes_the_shared_flags(monkeypatch, capsys):
    for name in discover():
        module = importlib.import_module(f"sparkinfer.lab.kernels.{name}")
        monkeypatch.setattr(sys, "argv", [name, "--help"])
        with pytest.raises(SystemExit) as info:
            module.main()
        assert info.value.code == 0
        usage = capsys.readouterr().out
        assert all(flag in usage for flag in ("--quick", "--warmup", "--iters")), name


@pytest.mark.parametrize("k", [64, 17408], ids=["rms_norm_first", "swiglu_first"])
def test_linear_timing_after_the_models_producer_kernel(monkeypatch, k):
    """--after-norm times each projection after the kernel the model runs before it: an RMSNorm
    of x, or for down_proj's 17,408-wide input the SwiGLU that makes it."""
    linear_bench = importlib.import_module("sparkinfer.lab.kernels.linear")
    shapes = []

    def run_once(calls, *, warmup, iters):
        for call in calls:
            call()
        return "timing"

    monkeypatch.setattr(linear_bench, "time_graph", run_once)
    operands = [(torch.randn(2, k), torch.randn(8, k))]

    def projection(x, w):
        shapes.append(tuple(x.shape))
        return x @ w.T

    assert linear_bench._time(projection, operands, 0, 1, after_norm=True) == "timing"
    assert linear_bench._time(projection, operands, 0, 1) == "timing"
    assert shapes == [(2, k), (2, k)]


def test_gemv_tune_times_every_kernel_in_context_and_drops_an_engine_choice(monkeypatch, tmp_path):
    linear_bench = importlib.import_module("sparkinfer.lab.kernels.linear")
    contexts = set()

    class Timing:
        median_ms = 0.05

    def fake_time(fn, operands, warmup, iters, *, after_norm=False):
        contexts.add(after_norm)
        return Timing()

    monkeypatch.setattr(linear_bench, "_time", fake_time)
    monkeypatch.setattr(linear_bench, "_operands", lambda m, n, k, device: [])
    entry = {"m": 1, "n": 16384, "k": 5120, "dtype": "bfloat16", "impl": "gemv",
             "gemv": {"BN": 8}, "chosen_by": "the engine"}  # fmt: skip
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"entries": [entry]}))
    table = linear_bench._tune_gemv(str(path), torch.device("cpu"), after_norm=True)
    (tuned,) = table["entries"]
    assert contexts == {True}
    assert tuned["timed"] == "after_norm" and "chosen_by" not in tuned
    assert tuned["impl"] == "cublas"  # every kernel tied: the GEMV must beat the others


def test_tma_retune_takes_a_faster_descriptor_tile_for_the_decode_rows(monkeypatch, tmp_path):
    linear_bench = importlib.import_module("sparkinfer.lab.kernels.linear")

    class Timing:
        def __init__(self, ms: float) -> None:
            self.median_ms = ms

    def fake_time(fn, operands, warmup, iters, *, after_norm=False):
        config = getattr(fn, "__defaults__", None)
        is_tma = bool(config) and getattr(config[0], "TMA", False)
        return Timing(0.04 if is_tma else 0.05)

    monkeypatch.setattr(linear_bench, "_time", fake_time)
    monkeypatch.setattr(linear_bench, "_operands", lambda m, n, k, device: [])
    rows = [{"m": m, "n": 5120, "k": 17408, "dtype": "bfloat16", "impl": "cublas"}
            for m in (1, 32, 64)]  # fmt: skip
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"entries": rows}))
    one, thirty_two, sixty_four = linear_bench._retune_tma(str(path), torch.device("cpu"))[
        "entries"
    ]
    assert one == rows[0] and sixty_four == rows[2]  # outside TMA_ROWS: kept as they were
    assert thirty_two["impl"] == "triton" and thirty_two["config"]["TMA"]
    assert thirty_two["tma_us"] == thirty_two["triton_us"] == 40.0
    widest = linear_bench._retune_tma(str(path), torch.device("cpu"), rows=(64,))["entries"]
    assert widest[:2] == rows[:2] and widest[2]["impl"] == "triton"  # only the rows asked for


def test_same_bytes_copies_move_half_the_traffic_each_way_between_distinct_buffers():
    from sparkinfer.lab.kernels._graph_timing import same_bytes_copies

    copies = same_bytes_copies(80, 3, torch.device("cpu"))
    outputs = [copy() for copy in copies]
    assert len(outputs) == 3 and all(isinstance(out, torch.Tensor) for out in outputs)
    assert {out.numel() * out.element_size() for out in outputs} == {40}
    assert all(torch.equal(out, torch.ones_like(out)) for out in outputs)
    assert len({out.data_ptr() for out in outputs}) == 3


def test_prefill_linear_pads_only_unaligned_widths(monkeypatch):
    """Each projection beside its weight padded to 128 and 256 output columns, where its width
    is not already a multiple (FLOPs counted as the unpadded product's), then at the power cap."""
    from sparkinfer.bench import roofline

    prefill_linear = importlib.import_module("sparkinfer.lab.kernels.prefill_linear")
    monkeypatch.setattr(prefill_linear, "PREFILL_ROWS", 8)
    monkeypatch.setattr(prefill_linear, "SHAPES", ((200, 16), (256, 16), (248320, 16)))
    monkeypatch.setattr(roofline, "measure_peaks", lambda device: roofline.Peaks(1.0, 1e12))
    outputs = []

    def run_once(calls, *, warmup, iters):
        outputs.extend(call() for call in calls)
        return Timing(1.0, 1.0, iters)

    monkeypatch.setattr(prefill_linear, "time_graph", run_once)
    rows = prefill_linear.bench(torch.device("cpu"), warmup=0, iters=2, is_quick=False)
    assert [(r["shape"], r["impl"]) for r in rows] == [
        ("M=8 N=200 K=16", "cublas"),
        ("M=8 N=200 K=16", "cublas, N padded to 128s"),
        ("M=8 N=200 K=16", "cublas, N padded to 256s"),
        ("M=8 N=200 K=16", "cublas, at the power cap"),
        ("M=8 N=256 K=16", "cublas"),
        ("M=8 N=256 K=16", "cublas, at the power cap"),
    ]  # cuBLASLt's candidates only on CUDA
    assert [tuple(o.shape) for o in outputs] == [(8, 200), (8, 256), (8, 256), (8, 256)]
    padded = prefill_linear._padded(torch.ones(200, 16), 128)
    assert padded.shape == (256, 16) and padded[200:].abs().sum() == 0


def test_decode_split_costs_variants_keep_splits_a_power_of_two_up_to_128():
    from sparkinfer.kernels.paged_attention.decode import DecodeConfig
    from sparkinfer.lab.kernels.paged_attention_tune import _variants

    plans = {name: c.MAX_SPLITS for name, c in _variants(DecodeConfig(MAX_SPLITS=64)).items()}
    assert plans == {"default": 64, "half the splits": 32, "twice the splits": 128,
                     "3 stages": 64, "8 warps": 64}  # fmt: skip
    assert "half the splits" not in _variants(DecodeConfig(MAX_SPLITS=1))
    assert "twice the splits" not in _variants(DecodeConfig(MAX_SPLITS=128))
