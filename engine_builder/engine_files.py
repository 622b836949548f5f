"""Names in an engine dir, shared by the build side and the runner (kept import-light for `run`)."""

ENGINE_SCHEMA = "trtbuild.engine"
ENGINE_SCHEMA_VERSION = 1
ORT_MODEL = "model.onnx"  # the onnxruntime twin
TRT_MODEL = "model.trt.onnx"  # the graph TensorRT parsed
ENGINE_FILE = "rank0.engine"
