"""The KV cache: one interface (kv_interface.py), the slot and paged storages behind it, prefix reuse, the pool."""
