"""tools/import_graph.py: jaxspec's imports have no cycle and no arrow back up (beyond the
named debts), and the tool catches each kind of problem on a synthetic package."""

from __future__ import annotations

from pathlib import Path

from tools import import_graph

ROOT = Path(__file__).resolve().parents[1]


def test_jaxspec_has_no_cycle_and_no_arrow_back_up():
    found, graph = import_graph.problems(ROOT)
    assert found == []
    assert "jaxspec.decoding.engine" in graph and "jaxspec.models.model" in graph["jaxspec.decoding.engine"]


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "jaxspec" / name
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
