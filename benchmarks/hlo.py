"""What a compiled program does, read from its HLO text: the collectives a decode step of
lookahead or tensor parallelism communicates (`benchmarks/parallel_bench.py`, and the tests of
both), and the copies of a KV cache its loop makes (the test of the in-place update; the long_context
study counted them too). Not part of the library: nothing at run time reads HLO."""

from __future__ import annotations

import re

import numpy as np

_COLLECTIVE = re.compile(r"=\s+(\w+)\[([\d,]*)\][^ ]*\s+(all-gather|all-reduce|collective-permute|all-to-all|"
                         r"reduce-scatter|collective-broadcast|send|recv)(?:-start)?\(")


_GROUPS = re.compile(r"replica_groups=(\{\{[\d,{}]*\}\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:<=\[([\d,]+)\](?:T\(([\d,]+)\))?)?\s*\{([^}]*)\}")


def _iota(dims: list[int], perm: list[int] | None) -> np.ndarray:
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    return ids.transpose(perm) if perm else ids


def _ints(text: str | None) -> list[int]:
    return [int(d) for d in re.findall(r"\d+", text or "")]


def collective_groups(line: str) -> list[list[int]] | None:
    """The device groups of a collective, None when the line names none. XLA writes them as
    explicit lists `{{0,4},{1,5}}`, as iota `[2,4]<=[8]` (rows of arange(8).reshape(2, 4)),
    optionally transposed `[4,2]<=[2,4]T(1,0)`, or over named mesh axes
    `mesh['a'=2,'b'=4] {'b'}` (the devices that differ only along the braced axes)."""
    match = _MESH_GROUPS.search(line)
    if match is not None:
        axes = re.findall(r"'([^']+)'=(\d+)", match.group(1))
        sizes = [int(n) for _, n in axes]
        ids = (_iota(_ints(match.group(2)), _ints(match.group(3))) if match.group(2)
               else np.arange(int(np.prod(sizes)))).reshape(sizes)
        over = set(re.findall(r"'([^']+)'", match.group(4)))
        inner = [i for i, (name, _) in enumerate(axes) if name in over]
        outer = [i for i in range(len(axes)) if i not in inner]
        size = int(np.prod([sizes[i] for i in inner])) if inner else 1
        return ids.transpose(outer + inner).reshape(-1, size).tolist()
    match = _GROUPS.search(line)
    if match is None:
        return None
    text = match.group(1)
    if text.startswith("{"):
        return [[int(d) for d in g.split(",") if d] for g in re.findall(r"\{([\d,]*)\}", text[1:-1])]
    shape, rest = text.split("<=")
    ids = _iota(_ints(rest.split("T")[0]), _ints(rest.split("T")[1]) if "T(" in rest else None)
    return ids.reshape(_ints(shape)[0], -1).tolist()


def hlo_collectives(hlo: str) -> list[dict]:
    """Every collective instruction of a compiled program's HLO text: op, dtype, result shape,
    result bytes, its device groups, and whether it sits inside a while loop body (i.e. runs
    every decode step).
    How LP's and TP's tests and `benchmarks/parallel_bench.py` measure what a step communicates."""
    found = []
    for line in hlo.splitlines():
        match = _COLLECTIVE.search(line)
        if match:
            dtype, dims, op = match.groups()
            shape = [int(d) for d in dims.split(",") if d]
            found.append({"op": op, "dtype": dtype, "shape": shape,
                          "bytes": int(np.prod(shape)) * int(re.sub(r"\D", "", dtype)) // 8,
                          "in_loop": "while/body" in line, "groups": collective_groups(line), "line": line.strip()[:200]})
    return found


def cache_copies(hlo: str, kv_heads: int, head_dim: int, layers: int | None = None) -> int:
    """Copies of a carried KV cache in a compiled program: float32 arrays of `KVCache`'s [layers,
    batch, KV heads, positions, head size] copied from a loop's state (a tuple element) or from
    another such copy; not the one-time copy of the zeros a cache starts from. `layers` None: any model's
    cache (a target's and its drafter's)."""
    depth = r"\d+" if layers is None else str(layers)
    return len(re.findall(rf"f32\[{depth},\d+,{kv_heads},\d+,{head_dim}\]\S* copy\(%(get-tuple-element|copy)", hlo))
