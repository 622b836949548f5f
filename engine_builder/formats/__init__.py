"""The contracts between stages, defined once: the checkpoint format (checkpoint.py, model_config.py,
quantization.py, quant_layout.py), the graph's I/O and KV layout (graph_io.py), the build config and
recipes (build_config.py) and the engine manifest (manifest.py). Imports only util/."""
