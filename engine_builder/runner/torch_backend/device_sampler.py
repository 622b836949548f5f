"""Next-token selection where the logits are: runner/sampler.py's semantics in torch ops on the logits' device.

A step's logits are [batch, vocab] float32 on the GPU (49152..128256 wide); copying them to the host every step
is what this file exists to avoid. What crosses per step:

    host -> device   only what the host owns, one copy per dtype (_to_device): each row's logit_bias, the
                     grammar's mask as bits (vocab / 8 bytes, grammar rows only), the distinct context ids of
                     repetition-penalized rows and the distinct generated ids + counts of presence/frequency
                     rows, the per-row parameters, and one uniform per sampling row
    device -> host   the [batch] token ids and, for rows that ask, the chosen token's logprob and rank and the
                     top-n pairs: one copy (_to_host)
    fast path        every row greedy with nothing to apply (no penalty, bias, grammar or logprobs): one argmax
                     and one [batch] int64 copy; nothing goes up

Same order and rules as Sampler: logit_bias, the grammar's mask, repetition penalty, presence/frequency
penalties, then for sampling rows temperature, top_k, top_p, min_p (logits_processors.py's tie and boundary
rules, mirrored op for op) and the inverse-CDF draw; greedy rows take the argmax. Logprobs are raw by default,
processed with logprobs_mode="processed", as there.

Seeded reproducibility: the uniform of each sampling row comes from the same numpy generator, in the same order,
as Sampler's (the row's own for a seeded request, else the sampler's), drawn on the host; only the search
through the CDF runs on the device. Up to the draw, the values are bit-identical to Sampler.process (bias, mask,
penalties and temperature are single IEEE float32 operations; top_k is a selection). The CDF is not: numpy's
float32 cumsum is sequential and drifts from the exact sum by up to vocab * 2^-24 of the total (1.7e-4 of it,
median, at 128k vocab), where torch's stays close: 2e-8 measured on the CPU (a double accumulator); a GPU's
float32 scan (a tree within blocks, a carry across them) has vocab / block_size roundings in sequence where
numpy has vocab, so this side is the more exact one there too (not measured here: no GPU). Where a token's mass
is below that drift (flat distributions at large vocab) a seeded draw can land on a neighbour of numpy's token:
measured at 128k vocab, logits of std 3, top-1 probability 0.07, 27% of draws (each one numpy's drift); at std 6
(top-1 0.44) 0.8%; at 1000 vocab 0.02%. exp's last bits differ too, far below that. top_p / min_p cuts within
rounding of their threshold can flip likewise (never seen in 60000 rows).
tests/runner/torch_backend/test_torch_sampler.py accepts a difference only as such a near-tie.

TorchSampler is a Sampler: numpy logits (the speculative verifier's host copies) take the numpy path, with
the same generator, so one sampler serves a torch backend's whole loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine_builder.runner.sampler import SampleOutput, Sampler, SamplingState, TokenLogprobs

NEG_INF = float("-inf")


class TorchSampler(Sampler):
    """Sampler(seed=None, logprobs_mode="raw"|"processed"); called on a torch tensor it samples on its device."""

    def __call__(self, logits: torch.Tensor | np.ndarray, states: Sequence[SamplingState]) -> SampleOutput:
        """One token per row. logits [batch, vocab] (float32 from the decoder), on any torch device."""
        if not isinstance(logits, torch.Tensor):
            return super().__call__(logits, states)
        _check(logits, states)
        batch = len(states)
        lp_rows = np.flatnonzero([s.params.logprobs is not None for s in states])
        tokens, processed, dev = self._tokens(logits, states, lp_rows)
        if not lp_rows.size:
            return SampleOutput(tokens.cpu().numpy(), (None,) * batch)

        source = logits if self.logprobs_mode == "raw" else processed  # raw: before the bias and the mask too
        lp_dev = dev["lp_rows"]
        logp = _log_softmax(source[lp_dev].float())  # [lp rows, vocab]
        chosen = logp.gather(1, tokens[lp_dev][:, None])  # [lp rows, 1]
        ranks = (logp > chosen).sum(dim=-1) + 1  # [lp rows]; 1 = the most likely
        ns = [min(states[r].params.logprobs, logits.shape[1]) for r in lp_rows]
        top_lp, top_ids = logp.topk(max(ns), dim=-1)  # [lp rows, n_max], most likely first
        tokens_h, chosen_h, ranks_h, top_lp_h, top_ids_h = _to_host(tokens, chosen[:, 0], ranks, top_lp, top_ids)
        out: list[TokenLogprobs | None] = [None] * batch
        for i, r in enumerate(lp_rows):
            pairs = tuple((int(top_ids_h[i, j]), float(top_lp_h[i, j])) for j in range(ns[i]))
            out[r] = TokenLogprobs(int(tokens_h[r]), float(chosen_h[i]), int(ranks_h[i]), pairs)
        return SampleOutput(tokens_h.astype(np.int64), tuple(out))

    def launch(self, logits: torch.Tensor, states: Sequence[SamplingState]) -> DeviceSample:
        """Each row's token, left on the logits' device with its copy to the host under way: async scheduling's
        next step takes them from there (runner/async_decode.py) before the host has them. No logprobs."""
        _check(logits, states)
        if any(s.params.logprobs is not None for s in states):
            raise ValueError("launch() samples tokens only; a row asking for logprobs goes through __call__")
        return DeviceSample(self._tokens(logits, states, np.zeros(0, np.int64))[0])

    def _tokens(self, logits: torch.Tensor, states: Sequence[SamplingState], lp_rows: np.ndarray
                ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """[batch] int64 tokens on the device, the logits they were chosen from, and the step's uploaded arrays
        (LP_ROWS, the rows asking for logprobs, among them); the uniforms are drawn here, on the host, in Sampler's
        order."""
        if all(_plain_greedy(s) for s in states):
            return logits.argmax(dim=-1), logits, {}  # [batch] int64
        host = _host_inputs(states, logits.shape[1])
        sample_rows = host.arrays["sample_rows"]
        rngs = [self._rng if states[r].rng is None else states[r].rng for r in sample_rows]
        # u in (0, 1], as Sampler draws it: a zero-weight token is then never the first with cdf >= target
        host.arrays["u"] = np.array([1.0 - g.random() for g in rngs], dtype=np.float64)  # [sampling rows]
        host.arrays["lp_rows"] = lp_rows
        dev = _to_device(logits.device, host.arrays)
        processed = _process(logits, dev, host)  # [batch, vocab]
        tokens = processed.argmax(dim=-1)  # [batch] int64; greedy rows keep this
        if sample_rows.size:
            tokens[dev["sample_rows"]] = _draw(processed[dev["sample_rows"]], dev["u"])
        return tokens, processed, dev

    def process_on_device(self, logits: torch.Tensor, states: Sequence[SamplingState]) -> torch.Tensor:
        """Sampler.process on the logits' device: [batch, vocab] float32, penalized for every row, then
        temperature/top_k/top_p/min_p-warped for sampling rows."""
        _check(logits, states)
        host = _host_inputs(states, logits.shape[1])
        return _process(logits, _to_device(logits.device, host.arrays), host)


class DeviceSample:
    """A step's sampled tokens on the device ([batch] int64 `tokens`), on their way to the host: on CUDA a copy into
    pinned memory queued behind the sampling, and an event the host waits on only in token_ids()."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens
        self._ready: torch.cuda.Event | None = None
        self._host = tokens
        if tokens.device.type == "cuda":
            self._host = torch.empty(tokens.shape, dtype=torch.int64, pin_memory=True)
            self._host.copy_(tokens, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()

    def token_ids(self) -> np.ndarray:
        """[batch] int64 on the host, once the step's sampling has run."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.cpu().numpy()


def _check(logits: torch.Tensor, states: Sequence[SamplingState]) -> None:
    if logits.ndim != 2 or logits.shape[0] != len(states):
        raise ValueError(f"logits must be [batch={len(states)}, vocab], got {tuple(logits.shape)}")
    for s in states:
        if s.vocab_size != logits.shape[1]:
            raise ValueError(f"state built for vocab {s.vocab_size}, logits have {logits.shape[1]}")


def _plain_greedy(s: SamplingState) -> bool:
    """Nothing but the argmax to compute for this row (Sampler applies penalties by seen / counts too)."""
    p = s.params
    return (p.greedy and s.seen is None and s.counts is None and not p.logit_bias and s.grammar is None
            and p.logprobs is None)


@dataclass
class _HostInputs:
    """A step's host-side arrays (uploaded together) and the sizes the device code branches on."""

    arrays: dict[str, np.ndarray]
    top_k_max: int  # the largest active top_k (0: none)


# per-row parameter columns of arrays["params"] [batch, 6] float32, each rounded to float32 as
# logits_processors.py rounds it (top_p's cut: 1 - top_p in float64, then float32)
REP, PRESENCE, FREQUENCY, TEMPERATURE, TOP_P_CUT, MIN_P = range(6)


def _host_inputs(states: Sequence[SamplingState], vocab: int) -> _HostInputs:
    """What the device needs from the host this step. Indices into the logits are flat (row * vocab + id)
    so one gather/scatter covers every row.

    Penalty state stays on the host, where it is the truth: SamplingState.append updates seen / counts, and
    the numpy Sampler, the speculative verifier and the draft proposer read the same states; a device mirror
    would have to hear of every append (and of a state rebuilt on preemption) to stay right. So each step
    sends np.flatnonzero of them (~90 us per row at 128k vocab on the host, as Sampler spends too) -- a
    context's distinct ids, a few KB, never the [vocab] arrays."""
    batch = len(states)
    ps = [s.params for s in states]
    params = np.array([[p.repetition_penalty, p.presence_penalty, p.frequency_penalty,
                        p.temperature if not p.greedy else 1.0, 1.0 - p.top_p, p.min_p] for p in ps],
                      dtype=np.float64).astype(np.float32).reshape(batch, 6)  # [batch, 6]

    bias_idx, bias_val = [], []
    grammar_rows, grammar_bits = [], []
    for row, s in enumerate(states):
        bias = s.params.logit_bias
        if bias:
            ids = np.fromiter((t for t, _ in bias), np.int64, len(bias))
            keep = ids < vocab  # ids past the model's vocab have no logit to bias
            bias_idx.append(row * vocab + ids[keep])
            bias_val.append(np.fromiter((b for _, b in bias), np.float32, len(bias))[keep])
        if s.grammar is not None:
            allowed = s.grammar.allowed()  # [vocab] bool
            if not allowed.any() and s.grammar.eos is not None:
                allowed[s.grammar.eos] = True  # the grammar failed: end the request (sampling_constraints.py)
            grammar_rows.append(row)
            # bits, 8x fewer bytes than bools (64 rows at 128k vocab: 1 MB instead of 8); ~9 us per row here
            grammar_bits.append(np.packbits(allowed, bitorder="little"))  # [ceil(vocab / 8)] uint8

    seen_rows = [r for r, s in enumerate(states) if s.seen is not None]
    rep_idx = [r * vocab + np.flatnonzero(states[r].seen) for r in seen_rows]  # distinct context ids
    count_rows = [r for r, s in enumerate(states) if s.counts is not None]
    generated = [np.flatnonzero(states[r].counts) for r in count_rows]  # distinct generated ids
    pf_idx = [r * vocab + ids for r, ids in zip(count_rows, generated)]
    pf_count = [states[r].counts[ids].astype(np.float32) for r, ids in zip(count_rows, generated)]

    # sampling rows, and within them (positions in that subset) the rows each warp touches
    sample_rows = np.flatnonzero([not p.greedy for p in ps])
    sp = [ps[r] for r in sample_rows]
    k = np.minimum(np.array([p.top_k for p in sp], np.int64), vocab)
    top_k_rows = np.flatnonzero((k > 0) & (k < vocab))
    top_p_rows = np.flatnonzero(np.array([p.top_p < 1.0 for p in sp], bool))
    min_p_rows = np.flatnonzero(np.array([p.min_p > 0 for p in sp], bool))
    arrays = {
        "params": params,
        "bias_idx": _cat(bias_idx, np.int64), "bias_val": _cat(bias_val, np.float32),
        "grammar_rows": np.array(grammar_rows, np.int64),
        "grammar_bits": np.stack(grammar_bits) if grammar_bits else np.zeros((0, (vocab + 7) // 8), np.uint8),
        "rep_idx": _cat(rep_idx, np.int64),
        "pf_idx": _cat(pf_idx, np.int64), "pf_count": _cat(pf_count, np.float32),
        "sample_rows": sample_rows,
        "top_k_rows": top_k_rows, "top_k": k[top_k_rows],
        "top_p_rows": top_p_rows, "min_p_rows": min_p_rows,
    }
    return _HostInputs(arrays, int(k[top_k_rows].max()) if top_k_rows.size else 0)


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _process(logits: torch.Tensor, dev: dict[str, torch.Tensor], host: _HostInputs) -> torch.Tensor:
    """Sampler.process's steps on the device; sizes are read from the host arrays (no synchronization)."""
    a = host.arrays
    batch, vocab = logits.shape
    x = logits.to(torch.float32, copy=True)  # [batch, vocab], the sampler's own: the caller's stays raw
    flat = x.view(-1)  # [batch * vocab]; the flat indices address it
    params = dev["params"]  # [batch, 6]

    if a["bias_idx"].size:
        flat[dev["bias_idx"]] += dev["bias_val"]  # ids are distinct per row (a dict's keys)
    if a["grammar_rows"].size:
        rows = dev["grammar_rows"]
        x[rows] = x[rows].masked_fill(~_unpack_bits(dev["grammar_bits"], vocab), NEG_INF)
    if a["rep_idx"].size:
        # HF's repetition penalty: a positive logit divided, a negative one multiplied
        idx = dev["rep_idx"]
        hit, p = flat[idx], params[idx // vocab, REP]  # [hits]
        flat[idx] = torch.where(hit < 0, hit * p, hit / p)
    if a["pf_idx"].size:
        # OpenAI: logit -= count * frequency + presence, over generated ids
        idx = dev["pf_idx"]
        row = idx // vocab
        flat[idx] -= dev["pf_count"] * params[row, FREQUENCY] + params[row, PRESENCE]

    if a["sample_rows"].size:
        rows = dev["sample_rows"]
        sub = x[rows] / params[rows, TEMPERATURE][:, None]  # [sampling rows, vocab]
        if a["top_k_rows"].size:
            sub = _top_k(sub, dev["top_k_rows"], dev["top_k"], host.top_k_max)
        if a["top_p_rows"].size:
            sub = _top_p(sub, dev["top_p_rows"], params[rows[dev["top_p_rows"]], TOP_P_CUT])
        if a["min_p_rows"].size:
            sub = _min_p(sub, dev["min_p_rows"], params[rows[dev["min_p_rows"]], MIN_P])
        x[rows] = sub
    return x


def _unpack_bits(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, ceil(vocab / 8)] uint8, np.packbits(bitorder="little") -> [rows, vocab] bool."""
    shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
    return ((bits[:, :, None] >> shifts) & 1).view(bits.shape[0], -1)[:, :vocab].bool()


def _top_k(sub: torch.Tensor, rows: torch.Tensor, k: torch.Tensor, k_max: int) -> torch.Tensor:
    """logits_processors.top_k: drop tokens strictly below the k-th largest (ties at it survive)."""
    part = sub[rows]  # [active, vocab]
    kth = part.topk(k_max, dim=-1).values.gather(1, (k - 1)[:, None])  # [active, 1]: k-th largest, ties counted
    sub[rows] = part.masked_fill(part < kth, NEG_INF)
    return sub


def _top_p(sub: torch.Tensor, rows: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """logits_processors.top_p: drop the ascending prefix whose cumulative probability is <= 1 - top_p (cut,
    already float32), always keeping the most likely token; ties at the first kept value all survive."""
    vocab = sub.shape[-1]
    part = sub[rows]  # [active, vocab]
    ascending = part.sort(dim=-1).values
    cumulative = _softmax(ascending).cumsum(dim=-1)  # [active, vocab] float32
    first_kept = (cumulative <= cut[:, None]).sum(dim=-1).clamp_max(vocab - 1)  # [active]
    threshold = ascending.gather(1, first_kept[:, None])  # [active, 1]
    sub[rows] = part.masked_fill(part < threshold, NEG_INF)
    return sub


def _min_p(sub: torch.Tensor, rows: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """logits_processors.min_p: drop tokens whose probability is below min_p times the top token's."""
    part = sub[rows]  # [active, vocab]
    probs = _softmax(part)
    floor = m[:, None] * probs.amax(dim=-1, keepdim=True)  # [active, 1]
    sub[rows] = part.masked_fill(probs < floor, NEG_INF)
    return sub


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """logits_processors.softmax's formula (not torch.softmax's fused one), so both round alike where they can."""
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    """logits_processors.log_softmax's formula: shifted - log(sum(exp(shifted)))."""
    shifted = x - x.amax(dim=-1, keepdim=True)
    return shifted - torch.log(torch.exp(shifted).sum(dim=-1, keepdim=True))


def _draw(processed: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Sampler's inverse-CDF draw: the first token, in vocab order, whose cumulative weight reaches u * total.

    processed [rows, vocab] float32, u [rows] float64 in (0, 1] -> [rows] int64. Unnormalized float32 weights,
    a float64 target (u * total <= total exactly), as there. Sampler counts cdf < target, which is that first
    token when the cdf is monotone and flat across zero weights, as numpy's sequential cumsum is; a GPU's
    parallel scan sums each prefix in its own order, so a zero-weight (filtered) token could come out a last bit
    above its predecessor: the search asks for weight > 0 too, which changes nothing where Sampler's premise
    holds. No position qualifies only for a NaN row; it gets the argmax (Sampler would give token 0)."""
    w = torch.exp(processed - processed.amax(dim=-1, keepdim=True))  # [rows, vocab]
    cdf = w.cumsum(dim=-1)  # [rows, vocab] float32
    target = (u * cdf[:, -1].double())[:, None]  # [rows, 1] float64; the comparison below runs in float64
    hit = (cdf >= target) & (w > 0)  # [rows, vocab]
    first = hit.to(torch.uint8).argmax(dim=-1)  # argmax returns the first maximal index
    return torch.where(hit.any(dim=-1), first, processed.argmax(dim=-1))


def _to_device(device: torch.device, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The step's host arrays on DEVICE in one copy per dtype: a host->device copy costs ~10 us whatever its
    size, and a step can hold a dozen small arrays. Views of the copied buffer, shaped as given. On CUDA from
    pinned memory, asynchronously: a copy from pageable memory waits for the stream's queued work first, which
    would make async scheduling's sampling wait for the step it just launched."""
    by_dtype: dict[np.dtype, list[str]] = {}
    for name, a in arrays.items():
        by_dtype.setdefault(a.dtype, []).append(name)
    out: dict[str, torch.Tensor] = {}
    for names in by_dtype.values():
        host = torch.from_numpy(np.concatenate([arrays[n].ravel() for n in names]))
        if device.type == "cuda":  # torch's pinned-memory cache keeps the block until the copy has run
            host = host.pin_memory()
        buf = host.to(device, non_blocking=True)
        for n, piece in zip(names, torch.split(buf, [arrays[n].size for n in names])):
            out[n] = piece.view(arrays[n].shape)
    return out


def _to_host(*tensors: torch.Tensor) -> list[np.ndarray]:
    """Device tensors back in one copy (one wait on the stream instead of one per tensor): flattened to
    float64, which holds every token id, rank and float32 logprob exactly; shapes kept."""
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors]).cpu().numpy()
    out, at = [], 0
    for t in tensors:
        out.append(flat[at:at + t.numel()].reshape(tuple(t.shape)))
        at += t.numel()
    return out
