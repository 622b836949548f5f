"""Write the prepacked twin (formats/ort_prepacked.py) beside model.onnx, for the twins it is made for."""

from __future__ import annotations

from pathlib import Path

from engine_builder.formats.manifest import ORT_MODEL
from engine_builder.formats.ort_graph_levels import GRAPH_CONFIG, optimization_level
from engine_builder.formats.ort_prepacked import META_PREPACKED_FOR, PREPACKED_DATA, PREPACKED_MODEL, cpu_signature


def prepacked_twin_wanted(twin_dtype: str, scheme: str, kv_layout: str) -> bool:
    """float32 twins of unquantized checkpoints with the slots KV layout: the CPU default that issue 16's cold
    start measured, where the packing is the weights' whole size. (Quantized twins pack MatMulNBits blocks,
    paged ones bind a pool: not measured, they load model.onnx as before.)"""
    return twin_dtype == "float32" and scheme == "none" and kv_layout == "slots"


def write_prepacked_twin(engine_dir: Path, twin_dtype: str) -> bool:
    """Let onnxruntime optimize ENGINE_DIR/model.onnx as a load would and save the result with its packed
    weights; False (nothing written) where this CPU's signature is unknown."""
    import onnx
    import onnxruntime as ort

    signature = cpu_signature()
    if signature is None:
        return False
    options = ort.SessionOptions()
    options.graph_optimization_level = optimization_level(twin_dtype)
    for key, value in GRAPH_CONFIG.items():
        options.add_session_config_entry(key, value)
    options.log_severity_level = 3
    options.optimized_model_filepath = str(engine_dir / PREPACKED_MODEL)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", PREPACKED_DATA)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    ort.InferenceSession(str(engine_dir / ORT_MODEL), options, providers=["CPUExecutionProvider"])
    graph = engine_dir / PREPACKED_MODEL
    model = onnx.load(str(graph), load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    props[META_PREPACKED_FOR] = signature
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, props)
    onnx.save(model, str(graph))  # the graph only: its tensors keep their external references
    return True
