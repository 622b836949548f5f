"""Triton Inference Server: the model repository `trtbuild export-triton` writes (triton_repo.py, run by
Triton's python backend through python_backend_model.py) and `trtbuild serve-triton`, which binds an engine to
the Triton binaries of the nvidia-pytriton wheel (pytriton_binding.py). Both speak one decoupled streaming
contract (triton_io.py), with one request parser and one response stream (triton_requests.py)."""
