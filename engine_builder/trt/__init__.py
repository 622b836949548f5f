"""The one TensorRT adapter: compat.py (tensorrt or tensorrt_rtx, one API), compatibility.py (can an
engine run here; the runtime reads it), engine_build.py and engine_layers.py (the builder side)."""
