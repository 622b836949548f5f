"""Sequences over one paged pool of a TorchDecoder, driven the way the runtime drives it: the torch-backend model
tests' harness (test_torch_model.py, test_fused_decode.py)."""

from __future__ import annotations

import torch

from engine_builder.runner.torch_backend.device_kv_attention import slot_mapping
from engine_builder.runner.torch_backend.model import PagedKV, TorchDecoder

BLOCK = 4  # tokens per pool block: a 12-token prompt spans 3 blocks


class PagedRun:
    """Sequences over one pool, the way the runtime drives the decoder: blocks handed out as each sequence
    grows, from a shuffled free list (so a sequence's blocks are neither contiguous nor in order)."""

    def __init__(self, decoder: TorchDecoder, num_blocks: int = 48, seed: int = 0, forward=None):
        """FORWARD: what runs a step (the decoder's contract; default the decoder itself), on the decoder's device."""
        self.decoder = decoder
        self.forward = forward or decoder
        self.k, self.v = decoder.new_pools(num_blocks, BLOCK)
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.blocks: dict[str, list[int]] = {}
        self.lengths: dict[str, int] = {}

    def step(self, chunks: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """One flat forward of each named sequence's new tokens -> each one's logits [its tokens, vocab]."""
        ids, positions, seq_of, query_start, context = [], [], [], [0], []
        for s, (name, tokens) in enumerate(chunks.items()):
            start = self.lengths.setdefault(name, 0)
            end = start + len(tokens)
            held = self.blocks.setdefault(name, [])
            while len(held) * BLOCK < end:
                held.append(self.free.pop())
            ids += tokens
            positions += range(start, end)
            seq_of += [s] * len(tokens)
            query_start.append(len(ids))
            context.append(end)
            self.lengths[name] = end
        width = max(len(self.blocks[name]) for name in chunks)
        table = torch.tensor([self.blocks[n] + [0] * (width - len(self.blocks[n])) for n in chunks], dtype=torch.int32)
        dev = self.decoder.device
        table, pos = table.to(dev), torch.tensor(positions, device=dev)
        kv = PagedKV(self.k, self.v, table, torch.tensor(context, device=dev), torch.tensor(query_start, device=dev),
                     slot_mapping(table, pos, torch.tensor(seq_of, device=dev), BLOCK))
        logits = self.forward(torch.tensor(ids, device=dev), pos, kv, torch.arange(len(ids), device=dev)).cpu()
        return {name: logits[query_start[s]:query_start[s + 1]] for s, name in enumerate(chunks)}

    def rewind(self, name: str) -> None:
        """Forget a sequence's cache (its blocks stay its own): the next step re-prefills it."""
        self.lengths[name] = 0

    def greedy(self, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
        """STEPS greedy tokens and the logits each came from; at the longrope switch the whole sequence is
        prefilled again, as the generation loop does (runner/generate.py `reprefill`)."""
        tokens, logits, feed = list(prompt), [], list(prompt)
        for _ in range(steps):
            if self.decoder.reprefill_after is not None and self.lengths.get("s") == self.decoder.reprefill_after:
                self.rewind("s")
                feed = list(tokens)
            last = self.step({"s": feed})["s"][-1]
            logits.append(last)
            tokens.append(int(last.argmax()))
            feed = tokens[-1:]
        return tokens[len(prompt):], logits
