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
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    link_weights(ckpt_dir, out_dir)
    path = out_dir / MODEL_FILE
    tmp = out_dir / f".{MODEL_FILE}.tmp-{os.getpid()}"
    try:
        # external_data=None keeps every weight where it is: location "rank0.safetensors"
        # relative to model.onnx, at its byte offset
        ir.save(model, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
