"""The import structure of `jaxspec`: fails on an import cycle or an arrow back up a layer.

    python tools/import_graph.py [--root .] [--json]

Reads every module under `jaxspec/` and under the packages beside it that it builds on
(BELOW: `pallas_kernels/`) with `ast` (nothing is imported) and builds two graphs:
module-level imports, and all imports (those inside functions too, which is how a cycle is
usually hidden). It fails (exit 1, one line per problem) on

* a cycle among module-level imports;
* a cycle among all imports that is not in KNOWN_LAZY_CYCLES (each one there is a debt with
  the issue that removes it);
* an arrow back up: a module of a lower layer (LAYERS) importing one of a higher layer, except
  the pairs in KNOWN_UPWARD (same: debts, named);
* a package of BELOW importing anything from `jaxspec`, in a function or not (no debt list
  excuses it: such a package stands alone, and jaxspec imports it as it imports any other).

CI runs it (.ci/run); tests/test_import_graph.py checks that it catches each kind on a
synthetic package.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

# Lower layers first; a module may import its own layer and the ones before it. A package
# name covers its modules; modules not listed are the top (the API: generate, chat, cli, ...).
LAYERS = (
    ("errors", "progress"),  # foundations
    ("models",),  # the model: architecture config, transformer, attention, KV cache, layouts
    ("decoding",),  # the engine, draft sources, verification, sampling, methods: no file I/O
    ("checkpoint", "real_prompts"),  # files: checkpoints, tokenizers, chat templates, drafters, prompt data
    ("runtime",),  # program cache, memory guard, devices, auto
    ("inputs", "stop_strings", "exactness", "generate", "chat"),  # the API (and the package's own `jaxspec.*` names)
    ("serving", "train", "cli"),  # applications
)
API_LAYER = 5
# Packages beside jaxspec, below all of its layers: any jaxspec module may import them, and they
# import nothing from jaxspec (what they need travels as arguments or lives in them). The
# design card names `pallas_kernels/`: the Pallas kernels, their mask specs, their XLA
# reference and their error, behind `jaxspec.models.attention`.
BELOW = ("pallas_kernels",)
# Named debts: (importer, imported) pairs and cycles tolerated until the issue that removes them
# lands (none today). A debt that is paid must leave its list: the check fails on it.
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_LAZY_CYCLES: set[frozenset[str]] = set()


def modules(root: Path, package: str = "jaxspec") -> dict[str, Path]:
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(module-level imports, all imports) of one module, as names of modules in `known`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def targets(node) -> list[str]:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        out = []
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != name:
                out.append(n)
        return out

    top_level: set[str] = set()
    everything: set[str] = set()
    body = list(tree.body)
    while body:  # module level, including under `if` / `try` (not in functions or classes)
        node = body.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top_level.update(targets(node))
        elif isinstance(node, (ast.If, ast.Try)):
            body += node.body + node.orelse + getattr(node, "finalbody", []) + [
                n for h in getattr(node, "handlers", []) for n in h.body]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            everything.update(targets(node))
    return top_level, everything


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer(name: str, package: str = "jaxspec", below=BELOW) -> int:
    parts = name.split(".")
    if parts[0] in below:
        return -1
    if name == package:
        return API_LAYER
    for i, names in enumerate(LAYERS):
        if len(parts) > 1 and parts[1] in names:
            return i
    return len(LAYERS)


def problems(root: Path, package: str = "jaxspec", known_upward=KNOWN_UPWARD,
             known_cycles=KNOWN_LAZY_CYCLES, below=BELOW) -> tuple[list[str], dict]:
    known = modules(root, package)
    for other in below:
        if (root / other).is_dir():
            known.update(modules(root, other))
    top, every = {}, {}
    for name, path in known.items():
        top[name], every[name] = imports(name, path, known)
    found = [f"import cycle at module level: {' <-> '.join(sorted(c))}" for c in cycles(top)]
    found += [f"import cycle through imports inside functions: {' <-> '.join(sorted(c))}"
              for c in cycles(every) if c not in known_cycles and c not in cycles(top)]
    for a in sorted(every):
        for b in sorted(every[a]):
            if a.split(".")[0] in below and b.split(".")[0] == package:
                found.append(f"{a.split('.')[0]} imports {package}: {a} imports {b} (pass what it needs as an "
                             f"argument, or move it into {a.split('.')[0]})")
            elif layer(b, package, below) > layer(a, package, below) and (a, b) not in known_upward:
                found.append(f"arrow back up: {a} (layer {layer(a, package, below)}) imports {b} "
                             f"(layer {layer(b, package, below)})")
    found += [f"debt paid: {a} no longer imports {b}; remove the pair from KNOWN_UPWARD"
              for a, b in sorted(known_upward) if b not in every.get(a, ())]
    found += [f"debt paid: {' <-> '.join(sorted(c))} is no longer a cycle; remove it from KNOWN_LAZY_CYCLES"
              for c in known_cycles if c not in cycles(every)]
    return found, {name: sorted(every[name]) for name in sorted(every)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the repository folder")
    parser.add_argument("--json", action="store_true", help="print the graph (module -> imports) as JSON")
    args = parser.parse_args(argv)
    found, graph = problems(Path(args.root))
    if args.json:
        print(json.dumps({"problems": found, "imports": graph}, indent=1))
    else:
        for line in found:
            print(line)
        print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports: "
              + ("no cycle, no arrow back up" if not found else f"{len(found)} problem(s)"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
