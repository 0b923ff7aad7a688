"""The run's metrics log (one JSON object per line, rewritten up to the restored step on
resume) and its loss plot; shared by the LM and drafter trainers."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path, upto: int) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line torn by a kill mid-write
            continue
        if rec["step"] <= upto and not rec.get("final"):
            out.append(rec)
    return out


def write_metrics(path: Path, records: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)


def append_metric(path: Path, rec: dict) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(rec) + "\n")


def plot_losses(records: list[dict], png: Path, title: str, ylabel: str = "nats / token") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plotting is a convenience; the numbers are in metrics.jsonl
        return
    train_pts = [(r["step"], r["loss"]) for r in records if "loss" in r]
    eval_pts = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    curves = {mode: [(r["step"], r[f"accept_len_{mode}"]) for r in records if f"accept_len_{mode}" in r]
              for mode in ("td", "ti")}
    if any(curves.values()):  # a drafter: its held-out acceptance beside the loss (the learning curve)
        fig, (ax, right) = plt.subplots(1, 2, figsize=(12, 4))
        for mode, pts in curves.items():
            if pts:
                right.plot(*zip(*pts), "o-", label=f"{mode.upper()} acceptance length")
        right.set_xlabel("step")
        right.set_ylabel("tokens per verification step (held out)")
        right.grid(alpha=0.3)
        right.legend()
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
    if train_pts:
        ax.plot(*zip(*train_pts), label="train loss", lw=1)
    if eval_pts:
        ax.plot(*zip(*eval_pts), "o-", label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
