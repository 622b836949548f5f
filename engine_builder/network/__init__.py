"""The decoder as an ONNX (opset 24) graph in portable, unfused ops, weights left in safetensors.

    model = build_decoder(ckpt_dir, NetworkOptions(max_seq_len=4096))   # onnx_ir.Model
    path = write_onnx(ckpt_dir, engine_dir, options)                  # engine_dir/model.onnx

The graph's inputs and outputs are described in `graph_io`.
"""

from engine_builder.network.decoder import IR_VERSION, OPSET, build_decoder
from engine_builder.network.export import MODEL_FILE, save_graph, write_onnx
from engine_builder.network.options import NetworkOptions

__all__ = ["IR_VERSION", "MODEL_FILE", "OPSET", "NetworkOptions", "build_decoder", "save_graph",
           "write_onnx"]
