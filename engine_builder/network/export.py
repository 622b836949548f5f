"""Write the decoder graph to a directory: model.onnx beside a hard link of rank0.safetensors."""

from __future__ import annotations

import os
from pathlib import Path

import onnx_ir as ir

from engine_builder.network.decoder import build_decoder
from engine_builder.network.options import NetworkOptions
from engine_builder.network.weights import link_weights

MODEL_FILE = "model.onnx"


def write_onnx(ckpt_dir: Path, out_dir: Path, options: NetworkOptions = NetworkOptions()) -> Path:
    """Build the graph of CKPT_DIR into OUT_DIR (created if missing); returns the model.onnx path.

    Each file appears complete or not at all (written beside, then renamed), so OUT_DIR can be
    the temp dir of a larger atomic build as well as a final destination.
    """
    model = build_decoder(ckpt_dir, options)  # fails on bad input before anything is written
    return write_graph(model, ckpt_dir, out_dir, MODEL_FILE)


def write_graph(model: ir.Model, ckpt_dir: Path, out_dir: Path, name: str) -> Path:
    """MODEL as OUT_DIR/NAME beside a link of CKPT_DIR's rank0.safetensors (the decoder's model.onnx, the vision
    graph's vision.onnx): written beside, then renamed. Returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    link_weights(ckpt_dir, out_dir)
    path = out_dir / name
    tmp = out_dir / f".{name}.tmp-{os.getpid()}"
    try:
        # external_data=None keeps every weight where it is: location "rank0.safetensors"
        # relative to the graph, at its byte offset
        save_graph(model, tmp, data_name=f"{name}.data")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def save_graph(model: ir.Model, path: Path, data_name: str | None = None) -> None:
    """Write MODEL to PATH. Checkpoint weights stay external where they are (rank0.safetensors at
    their byte offsets); tensors a pass derived from them (ir.LazyTensor, e.g. MatMulNBits' B) are
    computed one at a time and streamed into DATA_NAME (default PATH's name + ".data") beside it."""
    path = Path(path)
    derived = [v for v in model.graph.initializers.values() if isinstance(v.const_value, ir.LazyTensor)]
    if derived:
        written = ir.external_data.convert_tensors_to_external(
            [v.const_value for v in derived], path.parent, data_name or f"{path.name}.data")
        for value, tensor in zip(derived, written):
            value.const_value = tensor
    ir.save(model, path)
