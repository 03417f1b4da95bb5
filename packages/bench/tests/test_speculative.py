"""The `spec` mode end to end on the tiny random model (CPU): every drafter's outputs equal the
AR run's, and the oracle's right drafts are all accepted."""

import json

from sparkinfer.bench.__main__ import main
from sparkinfer.bench.speculative import OracleDrafter


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


class _Seq:
    def __init__(self, tokens: list[int], num_prompt: int) -> None:
        self.req = type("R", (), {})()
        self.req.token_ids, self.req.num_prompt_tokens = tokens, num_prompt
        self.req.num_output_tokens = len(tokens) - num_prompt


def test_the_oracle_is_right_on_the_first_drafts_only():
    oracle = OracleDrafter({(1, 2): [5, 6, 7, 8, 9]}, num_right=2)
    assert oracle.propose([_Seq([1, 2, 5], 2)], [3]) == [[6, 7, 8 ^ 1]]
    assert oracle.propose([_Seq([3, 4], 2)], [3]) == [[]]  # unknown prompt: no drafts
