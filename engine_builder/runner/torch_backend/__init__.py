"""The PyTorch backend: an engine dir's checkpoint weights run by torch on CUDA (or the CPU, for CI).

No TensorRT engine runs on Hopper here (shared/DESIGN.md §7), so the GPU runtime is torch over the canonical
tensors, the way TensorRT-LLM's own runtime went: model.py builds the decoder from the ModelConfig block spec,
attention.py holds the paged KV pool's write and the reference attention (gather + SDPA, the kernel's oracle),
paged_attention_triton.py the Triton kernel that reads the block table on the GPU, backend.py the registered
Backend.
"""
