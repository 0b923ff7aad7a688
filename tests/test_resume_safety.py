"""`--resume` refuses what would corrupt a run, before it writes anything (issue #19): a config
whose model, tokenizer or data settings differ from the run's saved config.json, and a step
count below the checkpoint being resumed; a corpus that does not exist leaves no run folder.
What may change on resume (docs/training.md) still resumes.

One tiny LM run (tests/test_train.py's synthetic corpus and 2-layer config, 4 steps) and one
tiny drafter run against it (2 steps) are shared by the tests; each test checks that every
file of the run folder is byte-identical after a refused resume.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from jaxspec.cli import main
from jaxspec.errors import ConfigError
from jaxspec.train.train_config import RESUMABLE_KEYS, TrainConfig, parse_train_config
from jaxspec.train.drafter_config import RESUMABLE_DRAFTER_KEYS, parse_drafter_config
from jaxspec.train.drafter_trainer import train_drafter
from jaxspec.train.trainer import train
from test_train import _raw_config, _synthetic_module, _write_toml

REPO = Path(__file__).resolve().parents[1]
QUIET = dict(log=lambda *a, **k: None, progress=False)


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` (files with their bytes, folders as None)."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def _lm_raw(corpus_root: Path, **train) -> dict:
    return _raw_config(corpus_root, **{"steps": 4, "log_every": 2, "eval_every": 100, "checkpoint_every": 2,
                                       **train})


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for i in range(24):
        (root / f"mod_{i:02d}.py").write_text(_synthetic_module(rng))
    return root


@pytest.fixture(scope="module")
def lm_run(corpus_root, tmp_path_factory) -> Path:
    """A finished 4-step run (checkpoints at 2 and 4, exported to run/model)."""
    out = tmp_path_factory.mktemp("lm") / "run"
    train(parse_train_config(_lm_raw(corpus_root)), out, **QUIET)
    return out


def _drafter_raw(target: Path, corpus_root: Path, **train) -> dict:
    return {
        "name": "tiny-drafter",
        "target": {"path": str(target)},
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
                  "intermediate_size": 64, "max_position_embeddings": 64},
        "pard": {"num_blocks": 3, "target_features": False},  # one eval mode: fewer compiles
        "data": {"corpus": str(corpus_root), "seq_len": 32, "heldout_fraction": 0.15},
        "optim": {"learning_rate": 1e-2, "warmup_steps": 1},
        "train": {"steps": 2, "batch_size": 8, "log_every": 1, "eval_every": 100, "eval_batches": 1,
                  "checkpoint_every": 2, "export_dtype": "float32", **train},
    }


@pytest.fixture(scope="module")
def drafter_run(lm_run, corpus_root, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("drafter") / "run"
    train_drafter(parse_drafter_config(_drafter_raw(lm_run / "model", corpus_root)), out, export=False, **QUIET)
    return out


# --- the LM trainer ---------------------------------------------------------------------------------

def test_resume_with_a_changed_model_tokenizer_or_data_is_refused_untouched(lm_run, corpus_root, tmp_path):
    before = _snapshot(lm_run)
    assert {"config.json", "data/train.npy", "data/tokenizer.model", "checkpoints/4"} <= set(before)
    raw = _lm_raw(corpus_root, steps=8, batch_size=4)  # steps may change, batch_size (the data order) not
    raw["model"]["hidden_size"] = 64
    raw["tokenizer"]["vocab_size"] = 384
    raw["data"]["include"] = ["mod_0*.py"]
    with pytest.raises(ConfigError) as e:
        train(parse_train_config(raw), lm_run, resume=True, **QUIET)
    message = str(e.value)
    assert "\n" not in message and "cannot --resume" in message
    for needle in ("[model] hidden_size was 32, now 64", "[tokenizer] vocab_size was 320, now 384",
                   '[data] include was ["*.py"], now ["mod_0*.py"]', "[train] batch_size was 8, now 4"):
        assert needle in message, (needle, message)
    assert "steps" not in message.split(" (")[0]  # a resumable change is not listed
    assert _snapshot(lm_run) == before

    # the CLI: one line, exit 2, nothing touched either
    config = _write_toml(tmp_path / "changed.toml", raw)
    rc = main(["train", "--config", str(config), "--out", str(lm_run), "--resume", "--no-progress"])
    assert rc == 2
    assert _snapshot(lm_run) == before


def test_resume_below_the_checkpoint_step_is_refused_untouched(lm_run, corpus_root, tmp_path, capsys):
    before = _snapshot(lm_run)
    config = _write_toml(tmp_path / "same.toml", _lm_raw(corpus_root))
    rc = main(["train", "--config", str(config), "--out", str(lm_run), "--resume", "--steps", "3", "--no-progress",
               "--json"])
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("jaxspec: error: ")]
    assert rc == 2 and captured.out == "", captured
    assert len(errors) == 1 and "for 3 steps" in errors[0] and "checkpoint is at step 4" in errors[0], captured.err
    assert "--steps 4" in errors[0] and "done:" not in captured.err
    assert _snapshot(lm_run) == before  # config.json, metrics, the export and the model card unchanged


def test_resume_may_change_the_length_and_the_cadences(lm_run, corpus_root, tmp_path):
    run = Path(shutil.copytree(lm_run, tmp_path / "run"))
    data = {k: v for k, v in _snapshot(run).items() if k.startswith("data/")}
    cfg = parse_train_config({**_lm_raw(corpus_root, steps=6, log_every=1, eval_every=5, checkpoint_every=3,
                                        keep_checkpoints=2, export_dtype="float32", sample_tokens=4),
                              "name": "renamed", "mesh": {"data": 1}})
    result = train(cfg, run, resume=True, export=False, **QUIET)
    assert result.steps == 6
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 6
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 5, 6, 6]  # old log kept; new cadence (log 1, eval 5) from step 5; final
    assert {k: v for k, v in _snapshot(run).items() if k.startswith("data/")} == data


def test_every_resumable_key_exists_and_is_documented():
    lm = {f"{s}.{k}" for s, v in TrainConfig(name="x").to_dict().items() if isinstance(v, dict) for k in v} | {"name"}
    assert RESUMABLE_KEYS <= lm and "pard.attention" in RESUMABLE_DRAFTER_KEYS
    doc = (REPO / "docs" / "training.md").read_text()
    for key in RESUMABLE_DRAFTER_KEYS:
        assert f"`{key.rpartition('.')[2]}`" in doc, key


def test_a_missing_corpus_creates_no_run_folder(tmp_path):
    raw = _lm_raw(tmp_path / "no-such-corpus")
    with pytest.raises(ConfigError, match="no-such-corpus.*does not exist"):
        train(parse_train_config(raw), tmp_path / "runs" / "x", **QUIET)
    assert not (tmp_path / "runs").exists()


# --- the drafter trainer ----------------------------------------------------------------------------

def test_drafter_resume_with_a_changed_config_is_refused_untouched(drafter_run, lm_run, corpus_root, tmp_path):
    before = _snapshot(drafter_run)
    assert {"config.json", "data/train.npy", "checkpoints/2"} <= set(before)
    raw = _drafter_raw(lm_run / "model", corpus_root, steps=5, log_every=2)
    raw["pard"]["num_blocks"] = 4
    raw["data"]["seq_len"] = 16
    raw["target"]["path"] = str(tmp_path / "another-target")  # refused before the target is even read
    with pytest.raises(ConfigError) as e:
        train_drafter(parse_drafter_config(raw), drafter_run, resume=True, **QUIET)
    message = str(e.value)
    assert "\n" not in message
    for needle in ("[pard] num_blocks was 3, now 4", "[data] seq_len was 32, now 16", "[target] path was"):
        assert needle in message, (needle, message)
    assert "log_every" not in message and "resolved_target_layers" not in message
    assert _snapshot(drafter_run) == before


def test_drafter_resume_below_the_checkpoint_step_is_refused_untouched(drafter_run, lm_run, corpus_root):
    before = _snapshot(drafter_run)
    cfg = parse_drafter_config(_drafter_raw(lm_run / "model", corpus_root, steps=1))
    with pytest.raises(ConfigError, match=r"for 1 steps: its newest checkpoint is at step 2 .*--steps 2"):
        train_drafter(cfg, drafter_run, resume=True, **QUIET)
    assert _snapshot(drafter_run) == before


def test_drafter_missing_corpus_creates_no_run_folder(lm_run, tmp_path):
    cfg = parse_drafter_config(_drafter_raw(lm_run / "model", tmp_path / "no-such-corpus"))
    with pytest.raises(ConfigError, match="does not exist"):
        train_drafter(cfg, tmp_path / "runs" / "d", **QUIET)
    assert not (tmp_path / "runs").exists()
