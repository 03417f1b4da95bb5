"""The offline report's tables, plots and gates from fixed rows (no GPU)."""

from sparkinfer.bench import offline_report
from sparkinfer.bench.engine import full_size_config
from sparkinfer.bench.hf_peer import PeerRow
from sparkinfer.bench.offline_report import DecodeRow, PrefillRow
from sparkinfer.bench.roofline import Peaks, decode_roofline_tok_s, prefill_roofline_tok_s

PEAKS = Peaks(copy_bytes_s=4e12, matmul_flop_s=9e14)
DECODE = [
    DecodeRow(1, 4096, 80.0, 80.0, 70.0, 100.0, 10.0, 0, True),
    DecodeRow(32, 4096, 50.0, 1500.0, 1400.0, 2000.0, 20.0, 1, True),
]
PREFILL = [PrefillRow(4096, 300.0, 320.0, 13_600.0, 20_000.0, 30.0, True)]


def test_tables_mark_goals_and_add_the_peer_only_when_it_ran():
    titles = [t.title for t in offline_report.tables(PEAKS, DECODE, PREFILL, [])]
    assert titles == [
        "measured peaks",
        "decode (greedy, fixed output length)",
        "prefill (one request, max_tokens 1)",
    ]
    peer = [PeerRow("decode @4096", 20.0, "")]
    peaks, decode, prefill, vs_peer = offline_report.tables(PEAKS, DECODE, PREFILL, peer)
    assert peaks.rows == [[4000.0, 900.0, None]]
    assert [r[8:10] for r in decode.rows] == [[76.0, "met"], [1600.0, "MISSED"]]
    assert prefill.rows[0][6:8] == [13_000.0, "met"]
    assert vs_peer.rows == [["decode @4096", 20.0, 80.0, 4.0, ""]]


def test_the_prefill_roofline_takes_the_matmul_rate_at_the_power_cap():
    capped = Peaks(copy_bytes_s=4e12, matmul_flop_s=9e14, capped_matmul_flop_s=6e14)
    assert offline_report.tables(capped, DECODE, PREFILL, [])[0].rows == [[4000.0, 900.0, 600.0]]
    cfg = full_size_config().text
    burst = prefill_roofline_tok_s(cfg, PEAKS, prompt_len=4096)
    assert prefill_roofline_tok_s(cfg, capped, prompt_len=4096) == burst * 6 / 9
    assert decode_roofline_tok_s(cfg, capped, batch=1, context=4096) == decode_roofline_tok_s(
        cfg, PEAKS, batch=1, context=4096
    )


def test_plots_and_gates():
    decode_plot, prefill_plot = offline_report.plots(DECODE, PREFILL)
    assert decode_plot.x == [1, 32] and decode_plot.series["sparkinfer"] == [80.0, 1500.0]
    assert prefill_plot.series["roofline"] == [20_000.0]
    gates = offline_report.gates(DECODE, PREFILL, use_goals=True)
    assert [g.is_passed for g in gates] == [False, False]
