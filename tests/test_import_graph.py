"""tools/import_graph.py: jaxspec's imports have no cycle and no arrow back up (beyond the
named debts), pallas_kernels imports nothing from jaxspec, and the tool catches each kind of
problem on a synthetic package."""

from __future__ import annotations

from pathlib import Path

from tools import import_graph

ROOT = Path(__file__).resolve().parents[1]


def test_jaxspec_has_no_cycle_and_no_arrow_back_up():
    found, graph = import_graph.problems(ROOT)
    assert found == []
    assert "jaxspec.decoding.engine" in graph and "jaxspec.models.model" in graph["jaxspec.decoding.engine"]
    # The attention backends are imported, not named by a string the graph cannot see.
    assert {"pallas_kernels.pallas_attention", "pallas_kernels.reference"} <= set(graph["jaxspec.models.attention"])
    assert "pallas_kernels.masks" in graph["jaxspec.models.masks"]
    kernels = {name: imported for name, imported in graph.items() if name.split(".")[0] == "pallas_kernels"}
    assert "pallas_kernels.pard_attention" in kernels
    assert all(not name.startswith("jaxspec") for imported in kernels.values() for name in imported)


def _package(tmp_path: Path, files: dict[str, str], package: str = "jaxspec") -> Path:
    for name, text in files.items():
        path = tmp_path / package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_cycles_and_upward_arrows_are_caught(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "", "models/__init__.py": "", "decoding/__init__.py": "", "checkpoint/__init__.py": "",
        "models/model.py": "from jaxspec.models import masks\n",  # model <-> masks at module level
        "models/masks.py": "import jaxspec.models.model\n",
        "decoding/sampling.py": "def f():\n    from jaxspec.decoding import exactness\n",  # a cycle hidden in functions
        "decoding/exactness.py": "from jaxspec.decoding.sampling import f\n",
        "decoding/engine.py": "from ..checkpoint.loading import load\n",  # decoding reads files: up a layer
        "checkpoint/loading.py": "from jaxspec.errors import E\nif True:\n    from ..models import config\n",
        "errors.py": "", "models/config.py": "",
    })
    found, graph = import_graph.problems(root, known_upward=set(), known_cycles=set())
    assert "import cycle at module level: jaxspec.models.masks <-> jaxspec.models.model" in found
    assert "import cycle through imports inside functions: jaxspec.decoding.exactness <-> jaxspec.decoding.sampling" in found
    assert any(line.startswith("arrow back up: jaxspec.decoding.engine") for line in found)
    assert len(found) == 3
    assert graph["jaxspec.checkpoint.loading"] == ["jaxspec.errors", "jaxspec.models.config"]  # relative and under `if`
    assert import_graph.main(["--root", str(root)]) == 1


def test_a_paid_debt_must_leave_the_lists(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "errors.py": "", "models/__init__.py": "", "models/model.py": ""})
    found, _ = import_graph.problems(root, known_upward={("jaxspec.errors", "jaxspec.models.model")},
                                     known_cycles={frozenset({"jaxspec.errors", "jaxspec.models.model"})})
    assert found == ["debt paid: jaxspec.errors no longer imports jaxspec.models.model; remove the pair from KNOWN_UPWARD",
                     "debt paid: jaxspec.errors <-> jaxspec.models.model is no longer a cycle; remove it from "
                     "KNOWN_LAZY_CYCLES"]


def test_pallas_kernels_importing_jaxspec_is_caught(tmp_path):
    """pallas_kernels sits below every jaxspec layer: jaxspec may import it from any layer, and it
    may import nothing from jaxspec, not even inside a function (how the XLA reference used to
    be reached) and not even when the pair is listed as a debt."""
    root = _package(tmp_path, {"__init__.py": "", "errors.py": "from pallas_kernels.errors import KernelConfigError\n",
                               "models/__init__.py": "", "models/attention.py": "import pallas_kernels.reference\n"})
    _package(root, {"__init__.py": "from pallas_kernels.errors import KernelConfigError\n", "errors.py": "",
                    "reference.py": "from .errors import KernelConfigError\n"}, package="pallas_kernels")
    found, graph = import_graph.problems(root)
    assert found == []
    assert graph["jaxspec.models.attention"] == ["pallas_kernels.reference"]
    assert graph["pallas_kernels.reference"] == ["pallas_kernels.errors"]  # relative imports resolve in the package

    _package(root, {"masks.py": "from jaxspec.errors import ConfigError\n",
                    "pard_attention.py": "def backward():\n    from jaxspec.models import attention\n"},
             package="pallas_kernels")
    found, _ = import_graph.problems(root, known_upward={("pallas_kernels.masks", "jaxspec.errors")})
    assert [line.split(" (")[0] for line in found] == [
        "pallas_kernels imports jaxspec: pallas_kernels.masks imports jaxspec.errors",
        "pallas_kernels imports jaxspec: pallas_kernels.pard_attention imports jaxspec.models.attention"]
    assert import_graph.main(["--root", str(root)]) == 1
