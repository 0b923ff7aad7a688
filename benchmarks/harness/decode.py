"""Decode benchmarks: cases x settings, timed interleaved, checked against the reference.

A benchmark declares a `DecodeBench` and `run_decode` measures it. Per setting and case it records
the new tokens, the steps (S = tokens / steps: the prefill is a step) and the seconds; a jaxspec
setting's seconds are `generate`'s decode time (compilation excluded: generate compiles ahead of
time) or, with `clock="wall"`, the whole call (`auto`'s choice included). Every setting compiles
and runs once on the first case before anything is timed (`warmup="all"`: on every case, for
wall-clock timing). Rounds repeat the whole grid; a setting's tokens/s is reported as the median
over rounds with min..max, and its speed against the reference as the median of the per-round
ratios. Every setting's tokens must equal the reference setting's on every case (and a case's own
reference tokens when it has them); the result says how many do.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from benchmarks.harness.order import interleaved


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    ids: tuple[int, ...]
    category: str = ""
    reference: tuple[int, ...] | None = None  # tokens an independent implementation produced


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    method: str = "autoregressive"
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # A decoder outside jaxspec (transformers): (case, new_tokens) -> {"tokens", "steps", "seconds"}.
    peer: Callable[[Case, int], dict] | None = None
    # A jaxspec.Model to decode with instead of the bench's (the same weights loaded another way).
    model: Any = None


@dataclasses.dataclass(frozen=True)
class DecodeBench:
    name: str  # results/<name>.{json,md,png}
    title: str
    model: Any  # a jaxspec.Model
    cases: Sequence[Case]
    settings: Sequence[Setting]
    new_tokens: int
    rounds: int = 1
    stop_at_eos: bool = False
    stop_ids: tuple[int, ...] = ()
    reference: str = "greedy"  # the setting every other one must equal
    clock: str = "decode"  # "decode": generate's decode seconds; "wall": the whole call
    warmup: str = "first"  # "first": one untimed run per setting; "all": every case once
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # recorded as given


def _jsonable(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return f"<{type(value).__name__}>"


def signature(bench: DecodeBench) -> str:
    """What makes two runs the same measurement (a resumed run must continue the same one)."""
    blob = json.dumps([bench.name, getattr(bench.model, "source", None), bench.new_tokens, bench.rounds,
                       bench.stop_at_eos, list(bench.stop_ids), bench.clock,
                       [(s.name, s.method, _jsonable(dict(s.options)), s.peer is not None)
                        + (() if s.model is None else (s.model.dtype,)) for s in bench.settings],
                       [(c.name, list(c.ids)) for c in bench.cases]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def decode(bench: DecodeBench, setting: Setting, case: Case) -> dict:
    """One timed decode of a case: tokens, steps, seconds and what the method reports about itself."""
    if setting.peer is not None:
        return setting.peer(case, bench.new_tokens)
    import jaxspec

    t0 = time.perf_counter()
    out = jaxspec.generate(setting.model or bench.model, list(case.ids), max_new_tokens=bench.new_tokens, method=setting.method,
                           stop_at_eos=bench.stop_at_eos, stop_ids=bench.stop_ids, **setting.options)
    wall = time.perf_counter() - t0
    row = {"tokens": list(out.tokens), "steps": int(out.steps),
           "seconds": wall if bench.clock == "wall" else out.seconds, "compile_seconds": out.compile_seconds,
           "state_bytes": out.memory.get("state_bytes")}
    for key in ("accept_length", "accepted_tokens", "draft_accepts", "target_steps", "drafter_wins"):
        if key in out.extras:
            row[key] = _jsonable(np.asarray(out.extras[key]).tolist())
    if out.auto is not None:
        row["auto"] = {"method": out.method, "draft_len": out.options.get("draft_len"),
                       "reason": out.auto["reason"], "trying": out.auto["trying"]}
    return row


class Journal:
    """The runs done so far, one JSON line each, so a killed benchmark resumes where it stopped."""

    def __init__(self, path: Path, sig: str, fresh: bool):
        self.path, self.done = path, {}
        if path.exists() and not fresh:
            lines = path.read_text().splitlines()
            head = json.loads(lines[0]) if lines else {}
            if head.get("signature") != sig:
                raise SystemExit(f"{path} holds runs of another configuration of this benchmark; "
                                 "pass --fresh to discard them")
            for n, line in enumerate(lines[1:], 1):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a line cut by the kill: dropped, and the file with it
                    path.write_text("\n".join(lines[:n]) + "\n")
                    break
                self.done[(rec["round"], rec["case"], rec["setting"])] = rec
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"signature": sig}) + "\n")
        self.resumed = len(self.done)

    def add(self, rec: dict) -> None:
        self.done[(rec["round"], rec["case"], rec["setting"])] = rec
        with self.path.open("a") as f:
            f.write(json.dumps(rec) + "\n")


def run_decode(bench: DecodeBench, journal_path: Path, fresh: bool = False, progress: bool = True) -> dict:
    """Measure `bench`; returns the result (without the machine and command facts `main_decode` adds)."""
    from tqdm import tqdm

    import jaxspec

    names = [s.name for s in bench.settings]
    if bench.reference not in names:
        raise ValueError(f"{bench.name}: the reference setting {bench.reference!r} is not among {names}")
    settings = {s.name: s for s in bench.settings}
    journal = Journal(journal_path, signature(bench), fresh)
    todo = [(r, c) for r in range(bench.rounds) for c in range(len(bench.cases))]
    skipped, compiled = {}, {}  # compiled: seconds each setting's warm-up spent compiling (or loading)
    if journal.resumed < len(todo) * len(names):  # something left to time: compile first
        for name in list(names):
            try:
                for case in bench.cases if bench.warmup == "all" else bench.cases[:1]:
                    compiled[name] = compiled.get(name, 0.0) + decode(bench, settings[name], case).get(
                        "compile_seconds", 0.0)
                    model = settings[name].model or bench.model
                    if getattr(model, "background", None) is not None:  # auto's tries: compiled before timing
                        model.background.wait()
            except jaxspec.GenerationError as e:  # a setting this model or prompt cannot run: said, not timed
                if name == bench.reference:
                    raise
                skipped[name] = str(e)
                names.remove(name)
                print(f"{bench.name}: {name} skipped ({e})", file=sys.stderr)
    bar = tqdm(total=len(todo) * len(names), initial=journal.resumed, desc=bench.name, disable=not progress,
               file=sys.stderr)
    gc.disable()  # as timeit does: a collection lands on whichever call is running, at random
    try:
        for k, (r, c) in enumerate(todo):
            gc.collect()
            for name in interleaved(names, k):
                if (r, c, name) in journal.done:
                    continue
                row = decode(bench, settings[name], bench.cases[c])
                if r > 0:  # the tokens of later rounds are checked, not stored again
                    first = journal.done[(0, c, name)]["tokens"]
                    row["same_as_round_0"] = row.pop("tokens") == first
                journal.add({"round": r, "case": c, "setting": name, **row})
                bar.update()
    finally:
        gc.enable()
        bar.close()
    runs = {name: [[journal.done[(r, c, name)] for c in range(len(bench.cases))] for r in range(bench.rounds)]
            for name in names}
    return {"benchmark": bench.name, "kind": "decode", "title": bench.title,
            "model": Path(str(getattr(bench.model, "source", "?"))).name, "new_tokens": bench.new_tokens,
            "rounds": bench.rounds, "stop_at_eos": bench.stop_at_eos, "clock": bench.clock,
            "reference": bench.reference, "resumed_runs": journal.resumed, "skipped": skipped,
            **_jsonable(dict(bench.facts)),
            "cases": [{"name": c.name, "category": c.category, "prompt_tokens": len(c.ids)} for c in bench.cases],
            "settings": [{"name": s.name, "method": s.method if s.peer is None else "peer", "options": _jsonable(
                dict(s.options)), "compile_seconds": compiled.get(s.name)} for s in bench.settings if s.name in names],
            "summary": summarize(bench, runs), "runs": runs}


def differences(model, cases: Sequence[Case], runs: dict, reference: str) -> list[dict]:
    """Every output unlike what it should be (a case's reference tokens where it has them, else the
    reference setting's), with where and how far apart the two disputed logits are
    (`jaxspec.exactness.compare`: one forward over the common prefix, per distinct disagreement)."""
    from jaxspec import exactness

    found, gaps = [], {}
    for name, rounds in runs.items():
        for case, row, ref in zip(cases, rounds[0], runs[reference][0]):
            expected = list(case.reference[:len(row["tokens"])]) if case.reference else ref["tokens"]
            at = exactness.first_difference(expected, row["tokens"])
            if at is None:
                continue
            key = (case.name, at, row["tokens"][at] if at < len(row["tokens"]) else None)
            if key not in gaps:
                gaps[key] = exactness.compare(model, case.ids, expected, row["tokens"])
            found.append({"setting": name, "case": case.name, **dataclasses.asdict(gaps[key]),
                          "near_tie": gaps[key].near_tie, "describe": gaps[key].describe(str(model.dtype))})
    return found


def _position_rates(rows: list[dict]) -> list:
    """a_k = P(draft k accepted | drafts 1..k-1 accepted) from each row's count of steps accepting
    draft k (`draft_accepts`) and its `target_steps`; position k counts only the rows that drafted
    that far (`auto` may have chosen a different K for each case)."""
    rates = []
    for k in range(max(len(row["draft_accepts"]) for row in rows)):
        far = [row for row in rows if len(row["draft_accepts"]) > k]
        accepted = sum(row["draft_accepts"][k] for row in far)
        reached = sum(row["draft_accepts"][k - 1] if k else row["target_steps"] for row in far)
        rates.append(None if reached == 0 else round(accepted / reached, 4))
    return rates


def _S(rows: list[dict]) -> float:
    return sum(len(row["tokens"]) for row in rows) / sum(row["steps"] for row in rows)


def summarize(bench: DecodeBench, runs: dict) -> dict:
    ref = [row["tokens"] for row in runs[bench.reference][0]]
    per_round_tps = {n: [sum(len(row0["tokens"]) for row0 in rs[0]) / sum(row["seconds"] for row in rnd)
                         for rnd in rs] for n, rs in runs.items()}
    summary = {}
    for name, rs in runs.items():
        first, tps = rs[0], per_round_tps[name]
        ratios = [a / b for a, b in zip(tps, per_round_tps[bench.reference])]
        s = summary[name] = {
            "S": _S(first), "new_tokens": sum(len(row["tokens"]) for row in first),
            "steps": sum(row["steps"] for row in first), "S_mean_per_case": float(np.mean([_S([x]) for x in first])),
            "tokens_per_second": statistics.median(tps), "tokens_per_second_range": [min(tps), max(tps)],
            "speed_vs_reference": statistics.median(ratios), "speed_vs_reference_range": [min(ratios), max(ratios)],
            "identical_to_reference": sum(row["tokens"] == g for row, g in zip(first, ref)),
            "same_every_round": all(row.get("same_as_round_0", True) for rnd in rs[1:] for row in rnd),
            "cases": len(first)}
        if any(c.category for c in bench.cases):
            s["S_per_category"] = {cat: _S([row for row, c in zip(first, bench.cases) if c.category == cat])
                                   for cat in dict.fromkeys(c.category for c in bench.cases)}
        if any(c.reference for c in bench.cases):
            s["cases_with_reference"] = sum(c.reference is not None for c in bench.cases)
            s["identical_to_case_reference"] = sum(c.reference is not None and row["tokens"] == list(
                c.reference[:len(row["tokens"])]) for row, c in zip(first, bench.cases))
        if first[0].get("state_bytes") is not None:
            s["state_bytes"] = max(row["state_bytes"] for row in first)
        # (over the cases decoded with a drafter: `auto` may have chosen one for some cases only)
        drafted = [row for row in first if "draft_accepts" in row]
        if drafted:
            target_steps = sum(row["target_steps"] for row in drafted)
            s["accept_length"] = (sum(row["accepted_tokens"] for row in drafted) / target_steps
                                  if all("accepted_tokens" in row for row in drafted) else None)
            s["position_acceptance"] = _position_rates(drafted)
            if all("drafter_wins" in row for row in drafted):
                s["drafter_branch_wins"], s["target_steps"] = sum(row["drafter_wins"] for row in drafted), target_steps
        if "auto" in first[0]:
            s["auto_choices"] = sorted({f"{row['auto']['method']} K={row['auto']['draft_len']}"
                                        if row["auto"]["draft_len"] else row["auto"]["method"] for row in first})
            s["auto_tries"] = sum(bool(row["auto"].get("trying")) for row in first)
    return summary
