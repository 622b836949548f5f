"""Readers of what `trtbuild convert` accepts: open_source.py picks hf_safetensors.py or gguf.py;
prequantized.py ingests AWQ/GPTQ linears of an HF dir."""
