"""The PyTorch backend: an engine dir's checkpoint weights run by torch on CUDA (or the CPU, for CI).

No TensorRT engine runs on Hopper here (shared/DESIGN.md §7), so the GPU runtime is torch over the canonical
tensors, the way TensorRT-LLM's own runtime went:

    registered.py             the registry's entry: usable here?, open (no torch import until it opens)
    runtime.py                the Backend at work: ModelInput -> device logits, KV pools on the device
    model.py                  the decoder from the ModelConfig block spec (layers, rope_tables, experts,
                              checkpoint_tensors: reading and dequantizing the canonical tensors)
    device_kv_attention.py    the paged pool's write (after rotary) and the reference attention: the oracles
    paged_attention_triton.py the Triton kernel that reads the block table on the GPU
    rotary_kv_write_triton.py the Triton kernel that rotates q and k and writes the pool, one launch a layer
    cuda_graphs.py            decode steps captured per batch-size bucket, short prefills per length
    device_sampler.py         sampling where the logits are
    device.py                 which device, and the KV pool's share of its memory
"""
