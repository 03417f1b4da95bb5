"""The `spec` mode end to end on the tiny random model (CPU): every drafter's outputs equal the
AR run's (on bf16 and on FP8 weights), the oracle's right drafts are all accepted, and priced rows
accept by their schedule."""

import contextlib
import json
from types import SimpleNamespace

import pytest
from sparkinfer.bench.__main__ import main
from sparkinfer.bench.spec_drafters import OracleDrafter, PricedDrafter
from sparkinfer.bench.speculative import _CallTimer, _DrafterTimer


def test_spec_mode_runs_every_drafter_with_identical_outputs(tmp_path, capsys):
    argv = ["spec", "--tiny", "--context", "40", "--new-tokens", "10", "--prompt", "repeat",
            "--deterministic", "--no-adaptive", "--oracle-accept", "3,1",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0  # the identical-outputs gate passes
    raw = json.loads((tmp_path / "spec.json").read_text())["raw"]
    rows = {(r["drafter"], r["oracle_accept"]): r for r in raw["rows"]}
    assert set(rows) == {("ngram", None), ("mtp", None), ("oracle", 3), ("oracle", 1)}
    assert all(r["is_identical"] for r in rows.values())
    assert rows[("oracle", 1)]["mean_accepted_len"] == 2.0
    assert rows[("oracle", 3)]["accepted_per_position"][0] == 1.0
    assert "spec tok/s" in capsys.readouterr().out


def test_spec_mode_on_fp8_weights_keeps_every_output(tmp_path, capsys):
    argv = ["spec", "--tiny", "--context", "40", "--new-tokens", "10", "--prompt", "repeat",
            "--deterministic", "--no-adaptive", "--drafters", "mtp,ngram",
            "--quantization", "fp8", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0  # the identical-outputs gate passes
    assert "quantizing the projections to FP8" in capsys.readouterr().err
    report = json.loads((tmp_path / "spec.json").read_text())
    assert "FP8" in json.dumps(report)  # the header says what the weights were
    rows = report["raw"]["rows"]
    assert {r["drafter"] for r in rows} == {"mtp", "ngram"}
    assert all(r["is_identical"] for r in rows)


class _Seq:
    def __init__(self, tokens: list[int], num_prompt: int) -> None:
        self.req = SimpleNamespace(
            token_ids=tokens,
            num_prompt_tokens=num_prompt,
            num_output_tokens=len(tokens) - num_prompt,
        )


def test_the_oracle_is_right_on_the_first_drafts_only():
    oracle = OracleDrafter({(1, 2): [5, 6, 7, 8, 9]}, num_right=2)
    assert oracle.propose([_Seq([1, 2, 5], 2)], [3]) == [[6, 7, 8 ^ 1]]
    assert oracle.propose([_Seq([3, 4], 2)], [3]) == [[]]  # unknown prompt: no drafts


def test_priced_rows_run_the_real_drafter_and_accept_by_the_schedule(tmp_path):
    argv = ["spec", "--tiny", "--context", "40", "--new-tokens", "10", "--prompt", "repeat",
            "--deterministic", "--no-adaptive", "--drafters", "mtp",
            "--priced-acceptance", "1,1,0", "--seed", "3", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    raw = json.loads((tmp_path / "spec.json").read_text())["raw"]
    priced = [r for r in raw["rows"] if r["priced"] is not None]
    assert [r["priced"] for r in priced] == [[1.0, 1.0, 0.0]]
    assert priced[0]["is_identical"] and priced[0]["draft_ms"] is not None  # the head ran
    assert priced[0]["accepted_per_position"] == [1.0, 1.0, 0.0]


class _Inner:
    needs_hidden = True

    def __init__(self) -> None:
        self.num_calls = 0

    def propose(self, seqs, num_drafts):
        self.num_calls += 1
        return [[0] * k for k in num_drafts]


def test_a_priced_drafter_pays_the_real_drafts_and_repeats_its_draws():
    inner = _Inner()
    known = list(range(10, 30))
    priced = PricedDrafter(inner, {(1, 2): known}, (0.9, 0.5), seed=7)
    seqs = [_Seq([1, 2, *known[:n]], 2) for n in range(15)]
    first = priced.propose(seqs, [2] * len(seqs))
    assert inner.num_calls == 1 and priced.needs_hidden
    assert first == priced.propose(seqs, [2] * len(seqs))  # seeded: the same draws again
    num_right = [
        sum(d == t for d, t in zip(row, known[n:], strict=False)) for n, row in enumerate(first)
    ]
    assert all(r in (0, 1, 2) for r in num_right) and len(set(num_right)) > 1
    with pytest.raises(ValueError, match="cannot exceed"):
        PricedDrafter(inner, {}, (0.5, 0.9), seed=0)


class _DeviceInner(_Inner):
    """Leaves its drafts on the device (`propose_drafts`), counting reads of them."""

    num_reads = 0

    def propose_drafts(self, seqs, num_drafts):
        import torch
        from sparkinfer.scheduler.speculative.drafter import Drafts

        self.num_calls += 1
        inner = self

        class Counted(Drafts):
            def host(self):
                inner.num_reads += 1
                return super().host()

        ids = torch.zeros(len(seqs), max(num_drafts), dtype=torch.int64)
        return Counted(num_drafts, ids=ids, rows=range(len(seqs)))


def test_a_priced_drafter_leaves_the_real_drafters_device_drafts_unread():
    inner = _DeviceInner()
    known = list(range(10, 30))
    priced = PricedDrafter(inner, {(1, 2): known}, (0.9, 0.5), seed=7)
    seqs = [_Seq([1, 2, *known[:n]], 2) for n in range(15)]
    drafts = priced.propose_drafts(seqs, [2] * len(seqs))
    assert inner.num_calls == 1 and inner.num_reads == 0 and not drafts.is_on_device
    assert drafts.host() == priced.propose(seqs, [2] * len(seqs))  # the same draws


def test_the_drafter_timer_times_each_call_into_its_timers():
    calls, blocks = _CallTimer(), _CallTimer()
    timer = _DrafterTimer(calls, blocks)
    for kind in ("draft_propose", "draft_observe", "decode_replay"):
        with timer.span(kind, None):  # the CPU: the wall clock
            pass
    assert len(calls.seconds()) == 2 and len(blocks.seconds()) == 1
    with _DrafterTimer(None, None).span("draft_propose", None):
        pass


class _Spans:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    @contextlib.contextmanager
    def span(self, kind, stream):
        self.log.append(f"{kind} begins")
        yield
        self.log.append(f"{kind} ends")


class _LoggedInner(_Inner):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def propose(self, seqs, num_drafts):
        self.log.append("inner")
        return super().propose(seqs, num_drafts)


def test_a_priced_drafter_gives_its_observer_the_real_drafters_calls_only():
    log: list[str] = []
    inner = _LoggedInner(log)
    priced = PricedDrafter(inner, {(1, 2): [5, 6]}, (0.9, 0.5), seed=7, observer=_Spans(log))
    priced.propose([_Seq([1, 2], 2)], [2])
    assert log == ["draft_propose begins", "inner", "draft_propose ends"]


def test_the_block_drafter_runs_with_identical_outputs_and_prices_its_blocks(tmp_path):
    argv = ["spec", "--tiny", "--context", "40", "--new-tokens", "10", "--prompt", "repeat",
            "--deterministic", "--no-adaptive", "--drafters", "dflash,oracle",
            "--oracle-accept", "4", "--num-speculative-tokens", "4", "--draft-layers", "2",
            "--priced-acceptance", "1,1,0.5,0", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0  # the identical-outputs gate passes
    raw = json.loads((tmp_path / "spec.json").read_text())["raw"]
    block = [r for r in raw["rows"] if r["drafter"] == "dflash"]
    assert [r["priced"] for r in block] == [None, [1.0, 1.0, 0.5, 0.0]]
    assert all(r["is_identical"] and r["num_drafts"] == 4 for r in block)
    assert all(r["block_ms"] is not None and r["draft_ms"] is not None for r in block)
    assert block[1]["accepted_per_position"][0] == 1.0  # priced: the drafter's rows made right


def test_code_mode_runs_the_embedded_drafter_on_held_out_code(tmp_path, capsys):
    """`bench code` on the CPU: the embedded model and its shipped drafter at blocks 8 and 16,
    every output identical to AR's (no acceptance asserted: the shipped weights vary)."""
    argv = ["code", "--cpu", "--context", "48", "--new-tokens", "8",
            "--num-speculative-tokens", "7,15", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0  # the identical-outputs gate passes
    raw = json.loads((tmp_path / "spec.json").read_text())["raw"]
    assert [(r["drafter"], r["num_drafts"]) for r in raw["rows"]] == [("dflash", 7), ("dflash", 15)]
    assert all(r["is_identical"] and r["mean_accepted_len"] >= 1.0 for r in raw["rows"])
    out = capsys.readouterr().out
    assert "AR tok/s" in out and "accepted len" in out


def test_code_mode_refuses_the_tiny_model(capsys):
    assert main(["code", "--tiny"]) != 0
    assert "--cpu runs them on the CPU" in capsys.readouterr().err
