"""What an installed wheel needs: the TOMLs the library reads at run time live in the package
(`jaxspec/configs`, a symlink to the top-level `configs/`, the one copy), pyproject ships them,
and the library reads them there. `.ci/run` builds the wheel and runs the quickstart from it."""

import tomllib
from pathlib import Path

import jaxspec
from jaxspec.runtime import auto
from jaxspec.checkpoint import method_defaults

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(jaxspec.__file__).resolve().parent


def test_package_configs_are_the_top_level_configs():
    packaged = PACKAGE / "configs"
    assert packaged.is_symlink() and packaged.resolve() == (REPO / "configs").resolve()  # one copy: no drift
    assert {p.name for p in packaged.glob("*.toml")} >= {"auto.toml", "lookahead.toml", "pycode.toml"}


def test_pyproject_ships_the_configs_as_package_data():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "configs/*.toml" in pyproject["tool"]["setuptools"]["package-data"]["jaxspec"]


def test_run_time_configs_are_read_from_the_package():
    # Not from the repository folder: an installed wheel has no `configs/` beside `jaxspec/`.
    assert auto.CONFIG.parent == PACKAGE / "configs" and auto.CONFIG.is_file()
    assert method_defaults.CONFIG_DIR == PACKAGE / "configs" and (method_defaults.CONFIG_DIR / "lookahead.toml").is_file()


def test_cli_finds_a_shipped_recipe_by_name(tmp_path, monkeypatch):
    from jaxspec.cli import build_parser

    monkeypatch.chdir(tmp_path)  # outside the repository, as after `pip install`
    for given in ("pycode", "pycode.toml", "configs/pycode.toml"):
        args = build_parser().parse_args(["train", "--config", given])
        assert Path(args.config) == PACKAGE / "configs" / "pycode.toml"
    args = build_parser().parse_args(["train-drafter", "--config", "pard2_smollm2"])
    assert Path(args.config) == PACKAGE / "configs" / "pard2_smollm2.toml"
    (tmp_path / "pycode.toml").write_text("")  # a file of that name here wins
    assert build_parser().parse_args(["train", "--config", "pycode.toml"]).config == "pycode.toml"
    assert build_parser().parse_args(["train", "--config", "nope"]).config == "nope"  # the loader names it
