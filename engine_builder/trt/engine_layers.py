"""What a built engine contains, layer by layer, without deserializing it.

Deserializing (and so IEngineInspector) needs a CUDA driver; on our CPU-only build hosts
TensorRT-RTX 1.7.1 fails with "cudaError 35: CUDA driver version is insufficient". So layer
information comes from the builder's own VERBOSE log when profiling verbosity is DETAILED
(the same Name/LayerType/TacticName/Metadata fields the inspector reports).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_ONNX_NODE = re.compile(r"\[ONNX Layer: ([^\]]*)\]")
_LOG_LAYER = re.compile(r"^Name: (?P<name>.*?), LayerType: (?P<type>[^,]*),.*?"
                        r"TacticName: (?P<tactic>[^,]*), StreamId: [^,]*, Metadata: (?P<meta>.*)$")


@dataclass(frozen=True)
class EngineLayer:
    name: str
    layer_type: str  # e.g. kgen, gemm, runtime_fusion, shape_call (Myelin) or Convolution...
    tactic: str  # kernel name, e.g. _gemv_mha_v1_0x... for fused decode attention
    onnx_nodes: tuple[str, ...]  # ONNX nodes this engine layer implements

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.layer_type, "tactic": self.tactic, "onnx_nodes": list(self.onnx_nodes)}


def layers_from_builder_log(messages: Iterable[str]) -> list[EngineLayer]:
    """Engine layers from the builder's VERBOSE 'Layers:' dump (needs ProfilingVerbosity.DETAILED)."""
    layers = []
    for message in messages:
        for line in message.splitlines():
            if m := _LOG_LAYER.match(line.strip()):
                layers.append(EngineLayer(m["name"], m["type"], m["tactic"].strip(),
                                          tuple(_ONNX_NODE.findall(m["meta"]))))
    return layers


def layers_from_inspector_json(text: str) -> list[EngineLayer]:
    """Engine layers from IEngineInspector.get_engine_information(LayerInformationFormat.JSON).

    Format per NVIDIA's docs ({"Layers": [...]}); not exercised here, deserializing needs a GPU.
    """
    layers = []
    for item in json.loads(text).get("Layers", []):
        if isinstance(item, str):  # ProfilingVerbosity.LAYER_NAMES_ONLY gives bare names
            layers.append(EngineLayer(item, "", "", ()))
        else:
            meta = str(item.get("Metadata", ""))
            layers.append(EngineLayer(str(item.get("Name", "")), str(item.get("LayerType", "")),
                                      str(item.get("TacticName", "")), tuple(_ONNX_NODE.findall(meta))))
    return layers


def count_layer_types(layers: Iterable[EngineLayer]) -> dict[str, int]:
    return dict(sorted(Counter(layer.layer_type for layer in layers).items()))
