"""benchmarks/roofline.py: the first-principles step-cost model (pure arithmetic: no JAX program runs here but
the calibration programs' head ones) and its check against a recorded run."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks import roofline
from jaxspec import ModelConfig
from jaxspec.errors import ConfigError, JaxspecError


def llama(vocab, hidden, ffn, layers, heads, kv_heads, head_dim=128):
    return ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                       num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                       max_position_embeddings=8192)


LLAMA31_8B = llama(128256, 4096, 14336, 32, 32, 8)
LLAMA2_7B = llama(32000, 4096, 11008, 32, 32, 32)
H100 = roofline.PROFILES["h100"]


def test_profiles_are_the_spec_sheets():
    p = roofline.PROFILES
    assert set(p) == {"a100", "h100", "h200", "v5e", "v5p", "v6e"}
    # The ridge point (FLOPs per byte where compute and memory balance) of every accelerator lies
    # in the 100-600 range of current parts; a typo in a unit would move it by 1000x.
    for prof in p.values():
        assert 100 < prof.peak_bf16_flops / prof.hbm_bytes_per_s < 600, prof.name
        assert prof.peak_fp32_flops < prof.peak_bf16_flops
        assert 0 < prof.fixed_layer_seconds < 1e-4
    assert p["h200"].hbm_bytes_per_s > p["h100"].hbm_bytes_per_s > p["a100"].hbm_bytes_per_s
    assert p["h200"].peak_bf16_flops == p["h100"].peak_bf16_flops  # same GH100 die
    assert p["v5e"].memory_bytes == 16e9 and p["h200"].memory_bytes == 141e9
    assert p["v6e"].tile_rows == 256 and p["v5p"].tile_rows == 128


def test_tile_padding_and_measured_curve():
    assert H100.efficiency(1) == pytest.approx(1 / 64)
    assert H100.efficiency(64) == 1.0
    assert H100.efficiency(65) == pytest.approx(65 / 128)
    cpu = dataclasses.replace(H100, matmul_rows=(1, 16), matmul_efficiency=(0.1, 0.9))
    assert cpu.efficiency(4) == pytest.approx(0.5)  # halfway in log rows
    assert cpu.efficiency(1000) == 0.9


def test_memory_bound_decoding_makes_small_blocks_nearly_free():
    # An 8B model at batch 1 on an H100 reads 16 GB of weights per step: a block of up to a few
    # dozen tokens rides along (c near 1), and the step is memory-bound.
    for t in (2, 8, 32):
        assert roofline.step_cost(LLAMA31_8B, t, 1, 4096, 2, H100) < 1.1
    assert roofline.forward_cost(LLAMA31_8B, 8, 1, 4096, 2, H100).compute_bound_fraction < 0.05
    assert roofline.step_cost(LLAMA31_8B, 1, 1, 4096, 2, H100) == 1.0


def test_compute_bound_cost_grows_linearly():
    c = {t: roofline.step_cost(LLAMA31_8B, t, 1, 0, 2, H100) for t in (1024, 2048, 4096)}
    assert c[2048] / c[1024] == pytest.approx(2, rel=0.15)
    assert c[4096] / c[2048] == pytest.approx(2, rel=0.15)
    assert roofline.forward_cost(LLAMA31_8B, 4096, 1, 0, 2, H100).compute_bound_fraction > 0.8


def test_batch_turns_the_block_compute_bound():
    t = roofline.lookahead_block_tokens(15, 5, 15)
    c1, c8, c64 = (roofline.step_cost(LLAMA31_8B, t, b, 4096, 2, H100) for b in (1, 8, 64))
    assert c1 < 1.5 < c8 < c64 and c64 > 5


def test_materialised_scores_cost_more_than_a_fused_kernel():
    t = roofline.lookahead_block_tokens(15, 5, 15)
    fused = roofline.step_cost(LLAMA31_8B, t, 8, 4096, 2, H100, "fused")
    xla = roofline.step_cost(LLAMA31_8B, t, 8, 4096, 2, H100, "xla")
    assert xla > 1.5 * fused


def test_paper_check_within_30_percent():
    # Fu et al. 2024: LLaMA-2-7B-chat, MT-Bench, A100, fp16, (W, N, G) = (15, 5, 15) with the
    # prompt pool: S = 2.05, 1.88x over greedy.
    t = roofline.lookahead_block_tokens(15, 5, 15)
    assert t == 120
    c = roofline.step_cost(LLAMA2_7B, t, 1, 512, 2, roofline.PAPER_PROFILE, "eager")
    assert roofline.predicted_speedup(2.05, c) == pytest.approx(1.88, rel=0.30)
    # and the paper's 7B config is memory-bound on an A100 even without the eager stack's host cost
    bare = dataclasses.replace(roofline.PAPER_PROFILE, fixed_layer_seconds=0.0, fixed_call_seconds=0.0)
    assert roofline.step_cost(LLAMA2_7B, t, 1, 512, 2, bare, "eager") < 1.3


def test_block_tokens_match_the_engine():
    from jaxspec.decoding.engine import Engine
    from jaxspec.decoding.sources.pool import NGramCandidates
    from jaxspec.decoding.sources.window import LookaheadWindow

    for w, n, g in ((15, 5, 15), (7, 4, 7), (5, 3, 5), (1, 3, 1), (4, 7, 0)):
        sources = (LookaheadWindow(window=w, levels=n - 1, verify_paths=True),)
        if g:
            sources += (NGramCandidates(ngram=n, guesses=g, from_prompt=True),)
        assert roofline.lookahead_block_tokens(w, n, g) == Engine(sources=sources).block_tokens
    assert roofline.prompt_lookup_block_tokens(4, 8) == Engine(sources=(NGramCandidates(ngram=4, guesses=8),)).block_tokens


def test_fits_reads_the_memory():
    assert not roofline.fits(LLAMA31_8B, 1, 4096, 2, roofline.PROFILES["v5e"])  # 16 GB of bf16 weights > 16 GB
    assert roofline.fits(LLAMA31_8B, 8, 4096, 2, H100)


@pytest.mark.parametrize("call", [
    lambda: roofline.step_cost(LLAMA31_8B, 0),
    lambda: roofline.step_cost(LLAMA31_8B, 8, batch=0),
    lambda: roofline.step_cost(LLAMA31_8B, 8, cache_len=-1),
    lambda: roofline.step_cost(LLAMA31_8B, 8, dtype_bytes=3),
    lambda: roofline.step_cost(LLAMA31_8B, 8.5),
    lambda: roofline.step_cost(LLAMA31_8B, 8, implementation="flash9"),
    lambda: roofline.step_cost(LLAMA31_8B, 8, profile="h100"),
    lambda: roofline.step_cost({"hidden_size": 4096}, 8),
    lambda: roofline.forward_cost(LLAMA31_8B, 8, head="probs"),
    lambda: roofline.predicted_speedup(0.5, 1.0),
    lambda: roofline.predicted_speedup(2.0, 0.0),
    lambda: roofline.predicted_speedup(float("nan"), 1.0),
    lambda: roofline.lookahead_block_tokens(15, 1, 15),
    lambda: dataclasses.replace(H100, hbm_bytes_per_s=-1.0),
    lambda: dataclasses.replace(H100, matmul_rows=(1, 8), matmul_efficiency=(0.5,)),
    lambda: dataclasses.replace(H100, read_curve=((2.0, 1e9), (1.0, 1e9))),
])
def test_bad_input_is_a_config_error(call):
    with pytest.raises(ConfigError) as info:
        call()
    assert isinstance(info.value, JaxspecError) and isinstance(info.value, ValueError)


# The calibration programs' shapes (`roofline.calibration_cases`, checked against these below): the tied LM
# head's [vocab, hidden] table, and the score-sized array of the per-element programs.
HEAD_TABLE = (32768, 512)
SCORES = (8, 128, 512)


def calibration_seconds() -> dict:
    """Seconds per step of every calibration program on a made-up CPU: matmuls at 100 GFLOP/s from 16 rows
    (less below), bf16 at 50, reads at 10 GB/s and read+write passes at 20 whatever the size, the tied head
    at 5 GB/s and its chunks copied at 8, a 2 ns exp and 4 ns argmax reduce per element (per score-sized
    array), 2 us per batched-matmul entry, 5 us per layer and 1 us per call."""
    elements = SCORES[0] * SCORES[1] * SCORES[2]
    s = {("matmul", r): 2 * r * roofline.CALIBRATION_WIDTH ** 2 / (100e9 * min(1.0, r / 16))
         for r in roofline.CALIBRATION_ROWS}
    s["bf16"] = 2 * 256 * roofline.CALIBRATION_WIDTH ** 2 / 50e9
    s.update({("read", n): n / 10e9 for n in roofline.READ_SIZES})
    s.update({("rw", n): 2 * n / 20e9 for n in roofline.RW_SIZES})
    table = HEAD_TABLE[0] * HEAD_TABLE[1] * 4
    s[("head", "whole")] = table / 5e9 + HEAD_TABLE[0] * 4e-3 / elements  # + the argmax's reduce
    s[("head", "chunked")] = s[("head", "whole")] + 2 * table / 8e9
    s.update(exp=2e-3, mul=1e-3, argmax=5e-3, max=1e-3, softmax=6e-3)
    s[("batched", 2)], s[("batched", 256)] = 1e-5, 1e-5 + 254 * 2e-6
    s[("tiny", 2)], s[("tiny", 10)] = 3 * 5e-6 + 1e-6, 11 * 5e-6 + 1e-6
    return s


def test_calibration_arithmetic():
    # Synthetic seconds per step: the derived quantities follow from the definitions.
    c = roofline.calibration(calibration_seconds())
    assert max(c["matmul_flops"].values()) == pytest.approx(100e9)
    assert c["tied_head_bytes_per_s"] == pytest.approx(5e9) and c["copy_bytes_per_s"] == pytest.approx(8e9)
    assert c["fixed_layer_seconds"] == pytest.approx(5e-6) and c["fixed_call_seconds"] == pytest.approx(1e-6)
    assert c["matmul_call_seconds"] == pytest.approx(2e-6)
    assert c["reduce_seconds"] == pytest.approx(4e-3 / (8 * 128 * 512))
    assert c["softmax_access_seconds"] == pytest.approx(1e-3 / (8 * 128 * 512))
    assert c["exp_seconds"] == pytest.approx(1e-3 / (8 * 128 * 512))
    profile = roofline.profile_from_measurements(c)
    assert profile.hbm_bytes_per_s == pytest.approx(10e9) and not profile.overlap and profile.gemm_packs
    assert profile.efficiency(4) == pytest.approx(0.25)


# The three models benchmarks/roofline.py measures, by shape
CHECKED = {name: dataclasses.replace(cfg, tie_word_embeddings=True) for name, cfg in {
    "stories260K": llama(512, 64, 172, 5, 8, 4, 8), "pycode-5M": llama(4096, 256, 688, 6, 4, 2, 64),
    "smollm2-135m-instruct": llama(49152, 576, 1536, 30, 9, 3, 64)}.items()}


def test_cpu_check_predicts_a_recorded_run_from_its_calibration():
    """benchmarks/roofline.py's check (c(T) of the three models within 40% of the measurement at every
    T > 1), on a run this test makes: `record`'s result from a made-up CPU's seconds (its calibration
    programs', `calibration_seconds`, and forwards that take what the calibrated model says, off by
    up to 30% per T), written as a result file is and read back. `predict` must give, from the file
    alone, c(T) = the model's on the recorded calibration, configs, cache and implementation: the
    measurement's known error exactly (within 40% here), and the same rows as the run itself.
    (docs/performance.md's claim about the recorded run on this CPU is checked by
    tools/performance_tables.py, which reads it.)"""
    from benchmarks.harness.result import dumps


    seconds = calibration_seconds()
    profile = roofline.profile_from_measurements(roofline.calibration(seconds))
    off = dict(zip(roofline.TOKENS, (0.0, 0.25, -0.2, 0.3, -0.25, 0.1)))  # the measurement's error per T
    for name, cfg in CHECKED.items():
        for t in roofline.TOKENS:
            model = roofline.predicted_seconds(cfg, t, 1, roofline.CACHE_LEN, 4, profile, "xla")
            seconds[("forward", name, t)] = model * (1 + off[t])
    steps = {("forward", name, t): 8 for name in CHECKED for t in roofline.TOKENS}
    run = roofline.record(seconds, CHECKED, steps, 3, {"cpu": "made-up CPU", "cpu_count": 2})

    recorded = json.loads(dumps(run))  # as benchmarks/results/roofline.json holds a run
    rows = roofline.predict(recorded)
    assert rows == run["rows"]  # the file alone gives the run's predictions
    assert {r["model"] for r in rows} == set(CHECKED)
    assert [(r["model"], r["tokens"]) for r in rows] == [(name, t) for name in CHECKED for t in roofline.TOKENS]
    for r in rows:
        cfg = CHECKED[r["model"]]
        assert r["params"] == cfg.num_params and r["steps"] == 8
        assert r["predicted_c"] == pytest.approx(roofline.step_cost(cfg, r["tokens"], 1, roofline.CACHE_LEN, 4, profile,
                                                                    "xla"), rel=1e-9)
        assert r["measured_c"] == pytest.approx(r["predicted_c"] * (1 + off[r["tokens"]]), rel=1e-9)
        assert 0 < r["compute_bound_fraction"] < 1
    errors = {(r["model"], r["tokens"]): r["predicted_c"] / r["measured_c"] - 1 for r in rows if r["tokens"] > 1}
    assert errors == pytest.approx({(name, t): 1 / (1 + off[t]) - 1 for name, t in errors}, rel=1e-9)
    assert all(r["predicted_c"] == pytest.approx(1.0) for r in rows if r["tokens"] == 1)

    # the predictions follow the recorded calibration, not this machine's or a default one
    slower = json.loads(dumps(run))
    slower["calibration"]["fixed_layer_seconds"] *= 100
    assert all(a["predicted_c"] < b["predicted_c"] for a, b in zip(roofline.predict(slower), rows) if a["tokens"] > 1)


def test_calibration_programs_build_and_the_head_ones_run():
    """benchmarks/roofline.py measures this CPU with these programs; the LM-head ones go through
    `Transformer.head_argmax` on a stand-in module, which must offer what it reads. Their shapes are
    the ones `calibration` assumes (HEAD_TABLE, SCORES)."""
    import jax

    cases = roofline.calibration_cases()
    assert set(calibration_seconds()) == set(cases)  # what `calibration` reads, every program
    for key in (("head", "whole"), ("head", "chunked")):
        fn, args, calls, steps = cases[key]
        assert calls == 1 and steps >= 2 and args[1].shape == HEAD_TABLE
        jax.block_until_ready(fn(*args))
    for key in ("exp", "mul", "softmax", "argmax", "max"):
        assert cases[key][1][0].shape == SCORES
