"""benchmarks/report.py turns whatever results exist into docs/benchmarks.md, and its --check fails
on results that lack their section's layout or provenance. (Whether the committed results pass is
`python -m benchmarks.report --check`'s to say: .ci/run runs it.)"""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import report


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_missing_and_unknown_results_are_noted(tmp_path):
    (tmp_path / "greedy_bench.json").write_text(json.dumps({"date": "2026-01-01", "something": "else"}))
    (tmp_path / "greedy_bench.md").write_text("# Greedy\n\n| a | b |\n")
    found = sections(report.build_report(tmp_path))
    assert "does not know the layout" in found["Greedy decoding: jaxspec vs transformers on stories260K"]
    assert "### Greedy" in found["Greedy decoding: jaxspec vs transformers on stories260K"]
    assert "*Not run yet*" in found["Lookahead parallelism: work and bytes per device"]


ATTENTION = {  # a complete attention_bench result, as benchmarks/attention_bench.py writes one
    "benchmark": "attention_bench", "date": "2026-01-02T03:04:05+00:00",
    "command": "python -m benchmarks.attention_bench",
    "machine": {"cpu": "made-up CPU", "cpu_count": 2, "jax": "0.0", "jax_backend": "cpu"},
    "config": {"heads": 4, "kv_heads": 2, "head_dim": 16, "dtype": "float32"}, "batch": 1,
    "rows": [{"block": "causal", "tokens": 8, "cache": 64, "variant": "xla", "ms": 1.0, "gb_per_s": 2.0,
              "max_abs_diff": 0.0}],
}


def test_a_retired_study_shows_the_markdown_its_script_wrote(tmp_path):
    """A study whose script is gone (RETIRED) has no renderer: its section is the committed markdown's table,
    without the markdown's own title and provenance line, and with the section's provenance table."""
    result = {"benchmark": "route_rule", "date": "2026-01-02", "command": "python -m benchmarks.route_rule",
              "machine": {"cpu": "made-up CPU", "cpu_count": 2, "jax": "0.0", "jax_backend": "cpu"}}
    (tmp_path / "route_rule_bench.json").write_text(json.dumps(result))
    (tmp_path / "route_rule_bench.md").write_text(
        f"# Route rule\n\n{report.standalone_provenance(result)}\n\nS per rule.\n\n| agree | S |\n|---|---:|\n")
    body = sections(report.build_report(tmp_path))[
        next(s.title for s in report.SECTIONS if s.stem == "route_rule_bench")]
    assert "S per rule.\n\n| agree | S |" in body and "# Route rule" not in body \
        and "made-up CPU (2 cores), JAX" not in body
    assert "| machine | made-up CPU" in body and "removed after" in body
    (tmp_path / "route_rule_bench.md").unlink()
    assert "does not know the layout" in sections(report.build_report(tmp_path))[
        next(s.title for s in report.SECTIONS if s.stem == "route_rule_bench")]


def _check(results, capsys) -> tuple[int, list[str]]:
    code = report.main(["--check", "--results", str(results)])
    return code, capsys.readouterr().out.splitlines()


def test_check_passes_complete_results_and_names_each_problem(tmp_path, capsys, monkeypatch):
    """Every section present with its heading; a result in a layout the report knows, with the machine,
    date and command it ran with, passes (sections without results say how to make them); a result
    the report cannot lay out, one without its machine or date, or an unreadable file fails, one line
    each, and no report is written."""
    monkeypatch.setattr(report, "OUT", tmp_path / "out" / "benchmarks.md")  # main's default --out
    title = next(s.title for s in report.SECTIONS if s.stem == "attention_bench")
    (tmp_path / "attention_bench.json").write_text(json.dumps(ATTENTION))
    found = sections(report.build_report(tmp_path))
    assert list(found) == [s.title for s in report.SECTIONS]
    assert all(row in found[title] for row in ("| machine | made-up CPU", "| date | 2026-01-02", "| command |"))
    code, out = _check(tmp_path, capsys)
    assert code == 0 and out == [f"{tmp_path}: 1 of {len(report.SECTIONS)} sections have a result, each in a "
                                 "layout the report knows, with its provenance"]

    no_provenance = {k: v for k, v in ATTENTION.items() if k not in ("machine", "date", "command")}
    (tmp_path / "attention_bench.json").write_text(json.dumps(no_provenance))
    (tmp_path / "greedy_bench.json").write_text(json.dumps({**ATTENTION, "benchmark": "greedy_bench"}))
    (tmp_path / "lp_bench.json").write_text("{not json")
    code, out = _check(tmp_path, capsys)
    assert code == 1 and sorted(out) == sorted([
        f"{tmp_path}/attention_bench.json records no machine",
        f"{tmp_path}/attention_bench.json records no date",
        f"{tmp_path}/greedy_bench.json: the report does not know its layout (update decode() in benchmarks/report.py)",
        f"{tmp_path}/lp_bench.json is unreadable (not JSON)",
    ])
    assert not (tmp_path / "out").exists()


def test_check_fails_when_the_committed_report_is_not_the_one_the_results_make(tmp_path, capsys):
    """A result rerun (or added) without regenerating the report: --check says so; once the report
    is written again it passes (the moment it was generated aside)."""
    out = tmp_path / "benchmarks.md"
    (tmp_path / "attention_bench.json").write_text(json.dumps(ATTENTION))
    assert report.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    capsys.readouterr()
    assert report.main(["--check", "--results", str(tmp_path), "--out", str(out)]) == 0
    (tmp_path / "attention_bench.json").write_text(json.dumps({**ATTENTION, "date": "2026-02-03"}))
    code, said = report.main(["--check", "--results", str(tmp_path), "--out", str(out)]), capsys.readouterr().out
    assert code == 1 and f"is not the report {tmp_path} make" in said
    assert report.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    assert report.main(["--check", "--results", str(tmp_path), "--out", str(out)]) == 0


def test_pard_ablation_reports_s_on_the_decoding_path(tmp_path):
    """benchmarks/pard_ablation.py on the default model's shipped drafter (2 prompts): every row has
    its S along the decoding path, between 1 and K + 1, inside its interval, in the table."""
    from benchmarks import pard_ablation

    assert pard_ablation.main(["--drafter", "shipped=jaxspec/assets/pycode-5M-pard2", "--prompts", "2",
                               "--new-tokens", "20", "--k", "4", "--lookup", "4,2", "--grid", "--out", str(tmp_path),
                               "--name", "pard_ablation"]) == 0
    r = json.loads((tmp_path / "pard_ablation.json").read_text())
    assert len(r["rows"]) == 5  # lookup alone, then TD and TI, each alone and beside lookup
    for row in r["rows"]:
        lo, hi = row["decode_path_s_ci"]
        assert 1 <= lo <= row["decode_path_s"] <= hi <= 5
    text = (tmp_path / "pard_ablation.md").read_text()
    assert "| S on the decoding path |" in text and "where a step of the decoding path starts" in text
    assert all(len(row["decode_path_position_rates"]) == 4 for row in r["rows"])
    # --grid: K' = 1..4 x (no lookup, N' = 2..5); its (4, none) and (4, 4) settings are the rows above
    for alone, beside in [r["rows"][1:3], r["rows"][3:5]]:
        grid = {(g["draft_len"], g["lookup_ngram"]): g for g in alone["grid"]}
        assert len(grid) == 20 and "grid" not in beside
        assert grid[4, None]["decode_path_s"] == alone["decode_path_s"]
        assert grid[4, 4]["decode_path_s"] == beside["decode_path_s"]
        assert grid[4, 4]["block_tokens"] == 11 and grid[1, None]["block_tokens"] == 2  # 4 + 1 + 2 x 3, 1 + 1
        assert all(1 <= g["decode_path_s"] <= g["draft_len"] + 1 for k, g in grid.items() if k[1] is None)
    assert f"| shipped | target-dependent | 4 | {r['rows'][1]['decode_path_s']:.3f} (5) |" in text


def test_cache_copies_counts_a_loops_copies_of_its_carried_cache():
    """benchmarks/hlo: copies of a carried cache are counted, not other copies."""
    from benchmarks.hlo import cache_copies

    text = ("%copy.1 = f32[30,1,3,2240,64]{4,3,2,1,0} copy(%get-tuple-element.7)\n"
            "%copy.2 = f32[30,1,3,2240,64]{4,3,2,1,0} copy(%copy.1)\n"
            "%copy.3 = f32[30,1,3,2240,64]{4,3,2,1,0} copy(%wrapped_broadcast.1)\n"  # the zeros it starts from
            "%copy.4 = f32[30,1,9,2240,64]{4,3,2,1,0} copy(%get-tuple-element.8)\n"  # not a cache of this model
            "%copy.5 = f32[2,1,3,2240,64]{4,3,2,1,0} copy(%get-tuple-element.9)\n")  # a drafter's
    assert cache_copies(text, 3, 64) == 3 and cache_copies(text, 3, 64, layers=30) == 2
