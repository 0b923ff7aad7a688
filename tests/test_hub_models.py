"""Models named as on the Hugging Face hub ("org/name"), resolved offline from the local HF cache
(HF_HUB_CACHE / HF_HOME respected), and HF cache repo folders (`models--org--name`). The cache
layout is written by the tests (blobs, refs/main, snapshots/<hash> of symlinks); no network."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

import jaxspec
from jaxspec.cli import main
from jaxspec.checkpoint.loading import model_in_folder, hf_cache_dir

REPO_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=128, bos_token_id=1, eos_token_ids=(2,),
)
REVISION = "0123456789abcdef0123456789abcdef01234567"


def write_cache_repo(hub: Path, repo_id: str, folder: Path, revision: str = REVISION, ref: bool = True) -> Path:
    """`folder`'s files as huggingface_hub caches a download: blobs, and a snapshot of symlinks."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for i, f in enumerate(sorted(folder.iterdir())):
        blob = repo / "blobs" / f"blob{revision[:6]}{i}"
        blob.write_bytes(f.read_bytes())
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return repo


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, jaxspec.Model]:
    model = jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(0)))
    return model.save(tmp_path_factory.mktemp("tiny") / "tiny"), model


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (the lookup is local_files_only anyway)
    (tmp_path / "hub").mkdir()
    return tmp_path / "hub"


def same_weights(a: jaxspec.Model, b: jaxspec.Model) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax_leaves(a), jax_leaves(b), strict=True))


def jax_leaves(model):
    import jax

    return jax.tree.leaves(model.params)


def test_hub_id_loads_from_the_cache(hub, saved):
    folder, model = saved
    repo = write_cache_repo(hub, REPO_ID, folder)
    loaded = jaxspec.load(REPO_ID)
    assert Path(loaded.source) == repo / "snapshots" / REVISION
    assert loaded.config.num_layers == 2 and same_weights(loaded, model)


def test_hf_home_is_respected(tmp_path, monkeypatch, saved):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hf_cache_dir() == tmp_path / "hf" / "hub"
    repo = write_cache_repo(tmp_path / "hf" / "hub", "org/tiny", saved[0])
    assert Path(jaxspec.load("org/tiny").source) == repo / "snapshots" / REVISION


def test_refs_main_picks_the_snapshot(hub, saved):
    repo = write_cache_repo(hub, "org/two", saved[0])
    (repo / "snapshots" / ("f" * 40)).mkdir()  # an older snapshot beside it, which refs/main does not name
    assert Path(jaxspec.load("org/two").source) == repo / "snapshots" / REVISION
    # The cache repo folder itself loads too (its refs/main -> snapshots/<hash>).
    assert Path(jaxspec.load(repo).source) == repo / "snapshots" / REVISION
    (repo / "refs" / "main").unlink()  # no ref and two snapshots: ambiguous, the error names one to pass
    with pytest.raises(jaxspec.CheckpointError, match="pass one"):
        jaxspec.load(repo)


def test_cache_repo_folder_without_ref_uses_its_only_snapshot(hub, saved):
    repo = write_cache_repo(hub, "org/noref", saved[0], ref=False)
    assert Path(jaxspec.load(repo).source) == repo / "snapshots" / REVISION


def test_missing_hub_model_names_the_download(hub):
    with pytest.raises(jaxspec.CheckpointError) as e:
        jaxspec.load("org/not-downloaded")
    message = str(e.value)
    assert "\n" not in message and "hf download org/not-downloaded" in message and str(hub) in message


def test_cli_takes_a_hub_id(hub, saved, capsys):
    write_cache_repo(hub, REPO_ID, saved[0])
    code = main(["generate", "--model", REPO_ID, "--prompt-ids", "1,5,7", "--max-new-tokens", "3",
                 "--method", "greedy", "--json", "--no-eos-stop"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and len(out["tokens"]) == 3 and out["config"]["model"].endswith(REVISION)
    code = main(["generate", "--model", "org/absent", "--prompt-ids", "1", "--json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "hf download org/absent" in err[0]


def test_named_models_and_paths_still_resolve(saved):
    assert Path(jaxspec.load(saved[0]).source) == saved[0]
    assert jaxspec.checkpoint.loading.resolve("pycode-5M") == jaxspec.checkpoint.loading.ASSETS / "pycode-5M"


def test_a_folder_of_gguf_files(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "m.Q4_0.gguf").write_bytes(b"")
    assert model_in_folder(tmp_path / "one") == tmp_path / "one" / "m.Q4_0.gguf"
    (tmp_path / "one" / "m.Q8_0.gguf").write_bytes(b"")
    with pytest.raises(jaxspec.CheckpointError, match="holds 2 GGUF files; pass one"):
        model_in_folder(tmp_path / "one")


def test_a_named_model_outside_the_package_says_how_to_point_at_it(monkeypatch, tmp_path):
    """stories260K lives in the shared folder beside the repository, not in the wheel: from an
    installed wheel the error names JAXSPEC_SHARED, the way to say where it is."""
    monkeypatch.setenv("JAXSPEC_SHARED", str(tmp_path))
    with pytest.raises(jaxspec.CheckpointError, match="JAXSPEC_SHARED"):
        jaxspec.load("stories260K")
