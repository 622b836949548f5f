"""The build stage: checkpoint -> graph -> passes -> TensorRT engine + ONNX twin (pipeline.py)."""
