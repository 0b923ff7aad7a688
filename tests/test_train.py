"""The training stack: config validation, data pipeline, loss goes down, exact resume after a
kill, a damaged latest checkpoint, and 8-device sharded training matching 1 device.

Everything runs on a synthetic Python-like corpus written by the test (a few hundred KB), a
512-token tokenizer and a 2-layer model, so each training run takes seconds.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxspec.cli import main
from jaxspec.errors import CheckpointError, ConfigError
from jaxspec.train import corpus
from jaxspec.train.train_config import load_train_config, parse_train_config
from jaxspec.train.trainer import train
from processes import check_all_succeeded, cpu_env, free_port, run_processes

REPO = Path(__file__).resolve().parents[1]

WORDS = ["value", "items", "count", "name", "path", "data", "result", "index", "key", "total", "node", "text"]


def _synthetic_module(rng: random.Random) -> str:
    lines = ["import os", "import sys", ""]
    for _ in range(rng.randint(8, 14)):
        fn, a, b = rng.choice(WORDS), rng.choice(WORDS), rng.choice(WORDS)
        lines += [f"def get_{fn}_{a}({a}, {b}=None):",
                  f"    \"\"\"Return the {fn} of {a}.\"\"\"",
                  f"    if {b} is None:",
                  f"        {b} = []",
                  f"    for {fn} in {a}:",
                  f"        {b}.append({fn} + {rng.randint(0, 99)})",
                  f"    return {b}", ""]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for i in range(24):
        (root / f"mod_{i:02d}.py").write_text(_synthetic_module(rng))
    (root / "notes.txt").write_text("not python: excluded by the include pattern\n")
    return root


def _raw_config(corpus_root: Path, **train) -> dict:
    return {
        "name": "tiny",
        "data": {"corpus": str(corpus_root), "seq_len": 32, "heldout_fraction": 0.15},
        "tokenizer": {"vocab_size": 320},
        "model": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
                  "intermediate_size": 64, "max_position_embeddings": 64},
        "optim": {"learning_rate": 1e-2, "warmup_steps": 2},
        "train": {"steps": 24, "batch_size": 8, "log_every": 1, "eval_every": 12, "eval_batches": 2,
                  "checkpoint_every": 4, "keep_checkpoints": 3, **train},
    }


def _write_toml(path: Path, raw: dict) -> Path:
    def fmt(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return json.dumps(v)

    lines = [f"name = {fmt(raw['name'])}"]
    for section, values in raw.items():
        if section != "name":
            lines += [f"[{section}]"] + [f"{k} = {fmt(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _losses(run_dir: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def _train_argv(config: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jaxspec", "train", "--config", str(config), "--out", str(out), "--no-progress",
            "--no-export", *extra]


def _train_cli(config: Path, out: Path, *extra: str, env=None) -> subprocess.Popen:
    # stderr goes to a file: a full pipe would block the child while the test polls its checkpoints.
    log = open(out.parent / f"{out.name}{'-'.join(('', *extra))}.log", "w+")
    proc = subprocess.Popen(_train_argv(config, out, *extra), stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                            cwd=REPO)
    proc.log = log  # Popen.stderr is None when stderr is a file: _stderr reads it back from here
    return proc


def _stderr(proc: subprocess.Popen) -> str:
    proc.log.seek(0)
    return proc.log.read()


# --- configuration ---------------------------------------------------------------------------------

@pytest.mark.parametrize("edit, fragment", [
    (lambda r: r["train"].update(stepz=3), "unknown key 'stepz' in [train]"),
    (lambda r: r.update(optimizer={}), "unknown key or section 'optimizer'"),
    (lambda r: r["train"].update(steps=0), "[train] steps = 0 is out of range"),
    (lambda r: r["train"].update(dtype="fp8"), "[train] dtype must be one of float32, bfloat16"),
    (lambda r: r["optim"].update(learning_rate="fast"), "[optim] learning_rate must be float"),
    (lambda r: r["data"].update(heldout_fraction=1.5), "[data] heldout_fraction = 1.5 is out of range"),
    (lambda r: r["model"].update(num_kv_heads=3), "must be a multiple of num_kv_heads"),
    (lambda r: r["data"].update(seq_len=128), "exceeds [model] max_position_embeddings"),
    (lambda r: r.pop("name"), "name = \"...\" is required"),
])
def test_bad_config_is_a_clear_error(tmp_path, edit, fragment):
    raw = _raw_config(tmp_path)
    edit(raw)
    with pytest.raises(ConfigError) as e:
        parse_train_config(raw, where="x.toml")
    assert fragment in str(e.value)


def test_cli_bad_config_exits_2_with_one_line(tmp_path, capsys):
    raw = _raw_config(tmp_path)
    raw["model"]["hidden_sise"] = 32
    rc = main(["train", "--config", str(_write_toml(tmp_path / "bad.toml", raw)), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "unknown key 'hidden_sise' in [model]" in err[0]
    assert main(["train", "--config", str(tmp_path / "missing.toml")]) == 2


def test_shipped_training_configs_parse():
    # Not training configs: lookahead defaults, auto's S table (test_auto); drafter configs: test_pard_training.
    for path in (REPO / "configs").glob("*.toml"):
        if path.name not in ("lookahead.toml", "auto.toml") and not path.name.startswith("pard2_"):
            cfg = load_train_config(path)
            assert cfg.model_config().num_params > 0


# --- data ------------------------------------------------------------------------------------------

def test_heldout_split_and_order_are_deterministic(corpus_dir):
    cfg = parse_train_config(_raw_config(corpus_dir))
    root, files = corpus.list_documents(cfg.data)
    assert "notes.txt" not in files and len(files) == 24
    assert [corpus.is_heldout(f, 0.15) for f in files] == [corpus.is_heldout(f, 0.15) for f in files]
    order = corpus.training_order(10, seed=3, start=0, count=30)
    for epoch in range(3):  # each epoch is a permutation, and epochs differ
        assert sorted(order[epoch * 10:(epoch + 1) * 10]) == list(range(10))
    assert list(order[:10]) != list(order[10:20])
    assert list(corpus.training_order(10, seed=3, start=7, count=9)) == list(order[7:16])
    assert list(corpus.training_order(10, seed=4, start=0, count=10)) != list(order[:10])


# --- training runs ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference_run(corpus_dir, tmp_path_factory):
    """An uninterrupted tiny run (in-process) that other tests compare against."""
    out = tmp_path_factory.mktemp("reference")
    cfg = parse_train_config(_raw_config(corpus_dir, sample_prompts=["def get_"], sample_tokens=8))
    result = train(cfg, out, progress=False, log=lambda *a, **k: None)
    return out, result


def test_training_lowers_the_loss_and_exports_a_loadable_model(reference_run):
    import jaxspec

    out, result = reference_run
    losses = _losses(out)
    assert sorted(losses) == list(range(1, 25))
    assert np.mean([losses[s] for s in (21, 22, 23, 24)]) < np.mean([losses[s] for s in (1, 2, 3, 4)]) - 0.5
    assert result.eval_loss < losses[1] and 0 < result.eval_bits_per_byte < 8
    assert (out / "loss.png").stat().st_size > 1000
    model = jaxspec.load(result.export_dir)
    assert model.config.vocab_size == 320 and model.tokenizer is not None
    text = "def get_value(items):\n    return items\n"
    assert model.tokenizer.decode(model.tokenizer.encode(text)[1:]) == text  # exact round trip of code
    card = (result.export_dir / "README.md").read_text()
    assert "held-out loss" in card and "def get_" in card


def test_resume_after_kill_reproduces_the_uninterrupted_loss_curve(corpus_dir, reference_run, tmp_path):
    """A subprocess is SIGKILLed after its first checkpoint; `--resume` must continue exactly."""
    ref_out, _ = reference_run
    # Same config as the reference run; a longer run would only slow the test down.
    config = _write_toml(tmp_path / "tiny.toml", _raw_config(corpus_dir, sample_prompts=["def get_"],
                                                                sample_tokens=8))
    out = tmp_path / "run"
    proc = _train_cli(config, out)
    deadline = time.time() + 600
    try:
        while time.time() < deadline and proc.poll() is None:
            ckpts = out / "checkpoints"
            if ckpts.exists() and any(p.name.isdigit() for p in ckpts.iterdir()):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, f"run was not killed mid-way: {proc.returncode} {_stderr(proc)}"
    assert not (out / "metrics.jsonl").exists() or max(_losses(out), default=0) < 24
    resumed = _train_cli(config, out, "--resume", "--json")
    stdout, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, _stderr(resumed)
    assert "resumed from step" in _stderr(resumed)
    assert _losses(out) == _losses(ref_out)  # bit-identical curve, every step
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["eval_loss"] == pytest.approx(reference_run[1].eval_loss, rel=1e-6)


def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(reference_run, corpus_dir, tmp_path):
    import shutil

    from jaxspec.train.checkpoints import TrainCheckpoints
    from jaxspec.train.trainer import init_params

    ref_out, _ = reference_run
    ckpt_dir = tmp_path / "checkpoints"
    shutil.copytree(ref_out / "checkpoints", ckpt_dir)
    mgr = TrainCheckpoints(ckpt_dir, keep=3)
    steps = mgr.steps()
    assert steps == [16, 20, 24]
    for f in (ckpt_dir / "24").rglob("*"):  # garble every data file of the newest checkpoint
        if f.is_file() and f.stat().st_size > 0 and not f.name.startswith("_CHECKPOINT_METADATA"):
            f.write_bytes(b"\x00garbage" * 8)
    cfg = parse_train_config(_raw_config(corpus_dir))
    import jax
    import optax

    from jaxspec.train.trainer import make_optimizer

    params, _ = init_params(cfg)
    like = {"params": params, "opt_state": make_optimizer(cfg.optim, 24).init(params),
            "step": jax.numpy.zeros((), jax.numpy.int32)}
    with pytest.raises(CheckpointError, match=r"checkpoint step 24 .* is unreadable .*delete"):
        mgr.restore(24, like)
    warnings = []
    step, state = mgr.restore_latest(like, log=warnings.append)
    assert step == 20 and int(state["step"]) == 20
    assert any("step 24" in w for w in warnings)
    assert optax.global_norm(state["params"]) > 0
    mgr.close()


def test_refuses_to_overwrite_a_run_without_resume(reference_run, corpus_dir):
    out, _ = reference_run
    with pytest.raises(CheckpointError, match="--resume"):
        train(parse_train_config(_raw_config(corpus_dir)), out, progress=False, log=lambda *a, **k: None)


def test_sharded_training_on_8_devices_matches_1_device(corpus_dir, reference_run, tmp_path):
    """data=4 x fsdp=2 over 8 forced CPU devices: same loss curve as the 1-device reference."""
    ref_out, _ = reference_run
    raw = _raw_config(corpus_dir, sample_prompts=["def get_"], sample_tokens=8, steps=24)
    raw["mesh"] = {"data": 4, "fsdp": 2}
    config = _write_toml(tmp_path / "sharded.toml", raw)
    env = cpu_env(8)
    proc = _train_cli(config, tmp_path / "run", "--json", env=env)
    stdout, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, _stderr(proc)
    ref, got = _losses(ref_out), _losses(tmp_path / "run")
    assert sorted(got) == sorted(ref)
    np.testing.assert_allclose([got[s] for s in sorted(got)], [ref[s] for s in sorted(ref)], rtol=2e-4)


def test_two_process_data_parallel_training_matches_one_process(corpus_dir, reference_run, tmp_path):
    """2 processes x 2 CPU devices (gloo, coordinator on 127.0.0.1): the 4-device data-parallel
    run gives the single-process loss curve; both processes finish; process 0 writes the metrics."""
    ref_out, _ = reference_run
    config = _write_toml(tmp_path / "dp.toml", _raw_config(corpus_dir, sample_prompts=["def get_"], sample_tokens=8))
    port = free_port()
    env = cpu_env(2)
    argvs = [_train_argv(config, tmp_path / "run", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                         "--process-id", str(i), "--json") for i in range(2)]
    finished = run_processes(argvs, env, timeout=600)  # a hung peer is killed
    check_all_succeeded(finished)
    results = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in finished]
    assert results[0]["eval_loss"] == pytest.approx(results[1]["eval_loss"], rel=1e-6)
    ref, got = _losses(ref_out), _losses(tmp_path / "run")
    assert sorted(got) == sorted(ref)
    np.testing.assert_allclose([got[s] for s in sorted(got)], [ref[s] for s in sorted(ref)], rtol=2e-4)


def test_gradient_accumulation_equals_one_large_batch(corpus_dir):
    """2 micro-batches of 4 give the same update as one batch of 8 (mean of equal-size means)."""
    import jax
    import jax.numpy as jnp

    from jaxspec.train.sharding import make_mesh, tree_shardings
    from jaxspec.train.trainer import init_params, make_optimizer, make_steps

    cfg = parse_train_config(_raw_config(corpus_dir))
    params, graphdef = init_params(cfg)
    optimizer = make_optimizer(cfg.optim, 10)
    mesh = make_mesh(cfg.mesh)
    opt_state = optimizer.init(params)
    step, _ = make_steps(graphdef, optimizer, jnp.float32, tree_shardings(mesh, params), tree_shardings(mesh, opt_state))
    tokens = jax.random.randint(jax.random.key(0), (8, 33), 3, 320)
    copy = lambda tree: jax.tree.map(jnp.array, tree)  # noqa: E731  (the step donates its inputs)
    p1, _, m1 = step(copy(params), copy(opt_state), tokens[None])
    p2, _, m2 = step(copy(params), copy(opt_state), tokens.reshape(2, 4, 33))
    assert float(m1["loss"]) == pytest.approx(float(m2["loss"]), rel=1e-6)
    assert float(m1["grad_norm"]) == pytest.approx(float(m2["grad_norm"]), rel=1e-5)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
