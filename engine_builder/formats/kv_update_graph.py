"""May an onnxruntime twin's present_key/value.{i} share past_*'s buffer? Read once from the graph, at build.

The build inspects the graph it wrote (`record_kv_update`) and stores the answer and its reason in the
graph's own metadata (trtbuild.kv_update, trtbuild.kv_update_reason; model.onnx's sha256 in the manifest
covers them), so `trtbuild run` reads them from the onnxruntime session it creates anyway, with no `onnx`
import and no second parse of the graph (~0.16 s of SmolLM2's cold start, issue 16). Engine dirs built
before that carry no reason key: the runner inspects their graph with `kv_update_mode` at load, as before.

  in_place  every present_* comes from GroupQueryAttention (com.microsoft) or TensorScatter-24, which
            detect the shared buffer and write only the new positions (onnxruntime 1.31).
  copy      any other producer: binding it over its own input is not known to be safe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from engine_builder.formats.graph_io import META_KV_UPDATE, save_with_metadata

META_KV_UPDATE_REASON = "trtbuild.kv_update_reason"  # why META_KV_UPDATE is what it is (written with it)

KVUpdateMode = Literal["in_place", "copy"]
# (domain, op) that update a past/present pair bound to one buffer in place (onnxruntime 1.31)
IN_PLACE_OPS = {("com.microsoft", "GroupQueryAttention"), ("", "TensorScatter"), ("ai.onnx", "TensorScatter")}


def recorded_kv_update(metadata: dict[str, str]) -> tuple[KVUpdateMode, str] | None:
    """The mode a graph's metadata states (the build's record, or a flag the network set), else None."""
    flag = metadata.get(META_KV_UPDATE)
    if flag not in ("in_place", "copy"):
        return None
    return flag, metadata.get(META_KV_UPDATE_REASON) or f"model metadata {META_KV_UPDATE}={flag}"  # type: ignore[return-value]


def kv_update_mode(model_path: Path) -> tuple[KVUpdateMode, str]:
    """Whether present_* may share past_*'s buffer, and why (metadata flag, else the producers)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)  # the graph only, not the weights
    return _mode_of(model)


def record_kv_update(model_path: Path) -> tuple[KVUpdateMode, str]:
    """Inspect the graph at MODEL_PATH and write the mode and its reason into its metadata (the graph file
    only: its external weights stay where they are)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    mode, reason = _mode_of(model)
    save_with_metadata(model, model_path, {META_KV_UPDATE: mode, META_KV_UPDATE_REASON: reason})
    return mode, reason


def _mode_of(model) -> tuple[KVUpdateMode, str]:
    recorded = recorded_kv_update({p.key: p.value for p in model.metadata_props})
    if recorded is not None:
        return recorded
    producers = {out: node for node in model.graph.node for out in node.output}
    ops: set[str] = set()
    for output in model.graph.output:
        if not output.name.startswith(("present_key.", "present_value.")):
            continue
        found = _producer_ops(producers.get(output.name), output.name)
        bad = [op for op in found if op not in IN_PLACE_OPS]
        if bad or not found:
            what = "/".join(op for _, op in bad) or "no node (a graph input?)"
            return "copy", f"{output.name} comes from {what}, not known to update a shared buffer in place"
        ops |= {op for _, op in found}
    return "in_place", f"present_* come from {', '.join(sorted(ops))}, which update a shared past/present buffer"


def _producer_ops(node, name: str) -> list[tuple[str, str]]:
    """(domain, op) producing `name`, looking through If into both branches."""
    if node is None:
        return []
    if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
        return [(node.domain, node.op_type)]
    index = list(node.output).index(name)
    found = []
    for attr in node.attribute:
        if attr.name in ("then_branch", "else_branch"):
            branch = attr.g
            inner = branch.output[index].name
            producers = {out: n for n in branch.node for out in n.output}
            found += _producer_ops(producers.get(inner), inner) or [("", "<outer value>")]
    return found
