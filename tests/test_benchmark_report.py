"""benchmarks/report.py turns whatever results exist into docs/benchmarks.md."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("benchmark_report", REPO / "benchmarks" / "report.py")
report = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = report  # dataclasses look their module up
_spec.loader.exec_module(report)


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_report_on_the_present_results_has_every_heading_and_provenance(tmp_path):
    out = tmp_path / "benchmarks.md"
    assert report.main(["--out", str(out)]) == 0
    found = sections(out.read_text())
    for section in report.SECTIONS:
        body = found[section.title]
        present = any((report.RESULTS / f"{stem}.json").exists() for stem in (section.stem, *section.variants))
        if present:
            assert "does not know the layout" not in body, f"update report.py for {section.stem}.json"
            for row in ("| machine |", "| date |", "| command |"):
                assert row in body, (section.stem, row)
        else:
            assert "*Not run yet*" in body and section.command in body


def test_missing_and_unknown_results_are_noted(tmp_path):
    (tmp_path / "greedy_bench.json").write_text(json.dumps({"date": "2026-01-01", "something": "else"}))
    (tmp_path / "greedy_bench.md").write_text("# Greedy\n\n| a | b |\n")
    found = sections(report.build_report(tmp_path))
    assert "does not know the layout" in found["Greedy decoding: jaxspec vs transformers on stories260K"]
    assert "### Greedy" in found["Greedy decoding: jaxspec vs transformers on stories260K"]
    assert "*Not run yet*" in found["Lookahead parallelism: work and bytes per device"]
