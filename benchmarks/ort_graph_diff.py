"""Two onnxruntime graphs side by side, op by op: what netron would show, as a table (no weights are read).

    python benchmarks/ort_graph_diff.py A/model.onnx B/model.onnx [--json]

Per graph: nodes per op type (subgraphs included), MatMulNBits grouped by signature (K, N, bits,
block_size, accuracy_level, zero points or not, bias or not) with their count, and the bytes of the
weights it reads per token (peers_build.weight_bytes: a table only gathered from counts a row), plus
the initializers MatMulNBits reads whose offset in the external data file is not a multiple of 64.
Made for issue 22 (our int4 twin against onnxruntime-genai's int4 model: `--int4` of
benchmarks/decode_overhead.py times the same pair), it takes any two ONNX files.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.append(str(HERE))  # after the repo root: benchmarks/passes.py would shadow passes/

from peers_build import weight_bytes  # noqa: E402


def _nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _nodes(sub)


def summary(path: Path) -> dict:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    ops: collections.Counter = collections.Counter()
    nbits: collections.Counter = collections.Counter()
    unaligned = []
    for node in _nodes(model.graph):
        ops[node.op_type] += 1
        if node.op_type != "MatMulNBits":
            continue
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        inputs = list(node.input) + [""] * 6
        nbits[f"K={a['K']} N={a['N']} bits={a.get('bits', 4)} block={a['block_size']} "
              f"level={a.get('accuracy_level', 0)} zero_points={'yes' if inputs[3] else 'no'} "
              f"bias={'yes' if inputs[5] else 'no'}"] += 1
        for name in inputs[1:4]:
            t = inits.get(name)
            offset = {e.key: e.value for e in t.external_data}.get("offset") if t is not None else None
            if offset is not None and int(offset) % 64:
                unaligned.append(f"{name} @ {offset}")
    return {"path": str(path), "nodes": sum(ops.values()), "ops": dict(ops.most_common()),
            "matmulnbits": dict(sorted(nbits.items())), "weight_mb_per_token": weight_bytes(path.parent) / 1e6,
            "unaligned_matmulnbits_inputs": unaligned}


def table(a: dict, b: dict) -> str:
    lines = [f"A {a['path']}: {a['nodes']} nodes, {a['weight_mb_per_token']:.1f} MB of weights read per token",
             f"B {b['path']}: {b['nodes']} nodes, {b['weight_mb_per_token']:.1f} MB of weights read per token",
             f"  {'op type':<36} {'A':>5} {'B':>5}"]
    for op in dict.fromkeys([*a["ops"], *b["ops"]]):
        na, nb = a["ops"].get(op, 0), b["ops"].get(op, 0)
        lines.append(f"  {op:<36} {na:>5} {nb:>5}{'' if na == nb else '   <-'}")
    lines.append("  MatMulNBits by signature:")
    for sig in sorted(set(a["matmulnbits"]) | set(b["matmulnbits"])):
        lines.append(f"    {sig:<80} {a['matmulnbits'].get(sig, 0):>4} {b['matmulnbits'].get(sig, 0):>4}")
    for name, s in (("A", a), ("B", b)):
        bad = s["unaligned_matmulnbits_inputs"]
        lines.append(f"  {name}: {len(bad)} MatMulNBits inputs at an external-data offset not a multiple of 64"
                     + (f" (e.g. {bad[0]})" if bad else ""))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for p in (args.a, args.b):
        if not p.is_file():
            print(f"error: {p} is not a file; pass two model.onnx paths", file=sys.stderr)
            raise SystemExit(2)
    a, b = summary(args.a), summary(args.b)
    print(json.dumps([a, b]) if args.json else table(a, b))


if __name__ == "__main__":
    main()
