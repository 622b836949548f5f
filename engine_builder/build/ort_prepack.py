"""Write the prepacked twin (formats/ort_prepacked.py) beside model.onnx, for the twins it is made for.

onnxruntime packs in a child process (`python -m engine_builder.build.ort_prepack DIR DTYPE`), as TensorRT
builds in one: its ~2x the float weights of memory (packed copies beside the mapped originals) is freed at
its exit and stays out of the build's own peak, which `trtbuild plan` predicts apart
(build/resource_plan.py twin_prepack_peak_bytes). Below IN_PROCESS_BYTES of weights it packs in the build's
own process: a child's start (~0.5 s) would cost more than the packing, and the memory is a few MB.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from engine_builder.formats.graph_io import save_with_metadata
from engine_builder.formats.manifest import ORT_MODEL
from engine_builder.formats.ort_graph_levels import GRAPH_CONFIG, optimization_level
from engine_builder.formats.ort_prepacked import META_PREPACKED_FOR, PREPACKED_DATA, PREPACKED_MODEL, cpu_signature
from engine_builder.util.errors import UnsupportedError

# The prepacked data holds the float32 weights twice more: worth it for a small model, whose first token is
# mostly session creation, not for a large one, whose disk doubles for a start dominated by reading weights.
MAX_WEIGHT_BYTES = 2 << 30


def prepacked_twin_wanted(twin_dtype: str, scheme: str, float32_weight_bytes: int) -> bool:
    """float32 twins of unquantized checkpoints up to MAX_WEIGHT_BYTES, either KV layout: the CPU default that
    issue 16's cold start measured, where the packing is the weights' whole size (a paged twin's decode step
    also gains from it: 1.082 -> 1.031 of the slot step at batch 1 on the quiet 2-core machine). Quantized twins
    pack MatMulNBits blocks: not measured, they load model.onnx as before."""
    return twin_dtype == "float32" and scheme == "none" and float32_weight_bytes <= MAX_WEIGHT_BYTES


IN_PROCESS_BYTES = 64 << 20


def write_prepacked_twin(engine_dir: Path, twin_dtype: str, weight_bytes: int) -> None:
    """write_prepacked_twin_here, in a child process unless the weights are small."""
    if weight_bytes < IN_PROCESS_BYTES:
        write_prepacked_twin_here(engine_dir, twin_dtype)
        return
    proc = subprocess.run([sys.executable, "-m", "engine_builder.build.ort_prepack", str(engine_dir), twin_dtype],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise UnsupportedError(f"onnxruntime could not save the prepacked twin of {engine_dir / ORT_MODEL}: {last}; "
                               "build with --dtype float16, or report it")


def write_prepacked_twin_here(engine_dir: Path, twin_dtype: str) -> bool:
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
    save_with_metadata(onnx.load(str(graph), load_external_data=False), graph, {META_PREPACKED_FOR: signature})
    return True


if __name__ == "__main__":
    write_prepacked_twin_here(Path(sys.argv[1]), sys.argv[2])
