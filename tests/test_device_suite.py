"""benchmarks/device_suite.py --smoke: the accelerator suite's every code path, on CPU with tiny shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_device_suite_smoke_runs_every_part_and_matches_greedy(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "device_suite.py"), "--smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    r = json.loads((tmp_path / "device_suite.json").read_text())
    md = (tmp_path / "device_suite.md").read_text()
    assert r["completed"] and r["smoke"]
    for key in ("device_kind", "jax", "jax_backend", "cpu"):
        assert r["machine"][key], key
    assert set(r["parts"]) == {"step_cost", "decoding", "attention"}
    for name, part in r["parts"].items():
        assert part["status"] == "done", (name, part["skipped"], part["errors"])

    # 1. c(T): both model slots x both attention backends, every T, c(1) == 1
    rows = r["parts"]["step_cost"]["rows"]
    ts = r["parts"]["step_cost"]["config"]["block_tokens"]
    cells = {(row["model"], row["attention"]) for row in rows}
    assert {a for _, a in cells} == {"xla", "pallas"} and len(cells) == 4
    for cell in cells:
        got = {row["T"]: row for row in rows if (row["model"], row["attention"]) == cell}
        assert sorted(got) == sorted(ts) and 1 in got and max(ts) > 1
        assert got[1]["c_median"] == 1.0 and got[1]["c_min"] == 1.0
        assert all(row["seconds_median"] > 0 for row in got.values())

    # 2. every method ran and is identical to greedy, on both models (harness.run_decode's summary)
    models = r["parts"]["decoding"]["models"]
    assert set(models) == {"pycode-5M", "synthetic-1b"}
    kinds = {s["method"] for e in models.values() for s in e["settings"]}
    assert kinds == {"autoregressive", "lookahead", "prompt-lookup", "speculative"}
    assert any("[pallas]" in name for name in models["synthetic-1b"]["summary"])
    for key, e in models.items():
        assert not e["mismatches"], (key, e["mismatches"])
        assert e["rounds"] == e["rounds_planned"] > 0
        for name, s in e["summary"].items():
            assert s["cases"] == len(e["cases"]) > 0 and s["identical_to_reference"] == s["cases"], (key, name)
            assert s["same_every_round"], (key, name)
            assert s["S"] >= 1.0 and s["tokens_per_second"] > 0 and s["speed_vs_reference"] > 0
        assert e["summary"]["greedy"]["S"] == 1.0
    assert r["outputs_differ_beyond_near_ties"] == 0

    # 3. attention: xla and both pallas variants, and the PARD kernel
    variants = {row["variant"] for row in r["parts"]["attention"]["rows"]}
    assert {"xla", "pallas dense", "pallas in-kernel", "pallas"} <= variants

    for heading in ("Step cost c(T)", "**pycode-5M**", "**synthetic-1b**", "**Attention**", "Device: cpu"):
        assert heading in md, heading


def test_report_shows_a_device_suite_result(tmp_path):
    from benchmarks import report

    r = {"benchmark": "device_suite", "smoke": False, "date": "2026-01-01T00:00:00+00:00", "command": "x",
         "machine": {"cpu": "c", "cpu_count": 16, "jax": "0.11", "jax_backend": "gpu", "device": "cuda:0"},
         "deadline_seconds": 420, "total_seconds": 400.0, "completed": True,
         "parts": {"step_cost": {"status": "partial", "skipped": [{"item": {"T": 256}, "reason": "deadline"}],
                                 "errors": [], "config": {"block_tokens": [1, 256], "cache_len": 2048,
                                                          "cache_filled": 1792, "dtype": "bfloat16", "repeats": 10,
                                                          "inner": 10},
                                 "rows": [{"model": "llama3-8b", "attention": "xla", "params": 8e9, "T": 1,
                                           "seconds_median": 0.004, "c_median": 1.0}]},
                   "decoding": {"status": "not run", "skipped": [], "errors": []},
                   "attention": {"status": "not run", "skipped": [], "errors": []}}}
    (tmp_path / "device_suite.json").write_text(json.dumps(r))
    text = report.build_report(tmp_path)
    body = text.split("## On an accelerator")[1].split("\n## ")[0]
    assert "does not know the layout" not in body
    assert "| llama3-8b | 8.00B | xla | 4.000 | 1.00 | skipped |" in body
    assert "Skipped (1)" in body


WATCHDOG = """
import threading, time
from benchmarks import device_suite as ds
args = ds.parse_args(["--smoke", "--out", {out!r}])
args.grace = 0.2
suite = ds.Suite(args, {{**ds.SMOKE, "deadline": time.monotonic() - ds.START + 0.5}})
suite.part("step_cost")["status"] = "running"
suite.current = "a compile that never returns"
threading.Thread(target=ds.watchdog, args=(suite, suite.deadline + args.grace), daemon=True).start()
time.sleep(120)
"""


def test_the_watchdog_writes_what_was_measured_and_ends_a_stuck_run(tmp_path):
    code = WATCHDOG.format(out=str(tmp_path))  # (`-c` from the repository root: `benchmarks` is importable)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, cwd=REPO)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    r = json.loads((tmp_path / "device_suite.json").read_text())
    assert r["completed"] is False and r["interrupted"]["while"] == "a compile that never returns"
    assert r["parts"]["step_cost"]["status"] == "interrupted"
    assert "**interrupted**" in (tmp_path / "device_suite.md").read_text()
