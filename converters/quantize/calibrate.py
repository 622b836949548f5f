"""Activation statistics of every linear's input, from prefilling calibration text through the float graph.

    data = collect(fp_ckpt_dir, calibration_text.load(None), DEFAULT_SAMPLES, DEFAULT_SEQ_LEN)
    data.inputs["layers.3.mlp.down"].absmax     # [in] f32: SmoothQuant, FP8 input scales
    data.inputs["layers.3.mlp.down"].sample     # [n <= 512, in] f32 tokens: the AWQ scale search
    data = collect(..., caches=True)
    data.caches["layers.3.attn.k_cache"]         # [kv_heads, head_dim] f32 max |k|: int8 KV-cache scales

The graph is the one `trtbuild build` emits (float32, unfused, before any pass), so the
statistics are of exactly the activations the quantized graph will multiply: each linear's
input is the first input of the MatMul whose second input is Transpose(<its weight>) (see
engine_builder/network/builder.py `linear`), exposed as an extra graph output. Only running
sums and a fixed token subsample are kept, so memory does not grow with the number of windows.
With `caches`, the present_key / present_value outputs are kept too: a window prefilled from
empty caches into a graph of max_seq_len = seq_len fills every slot, so they hold exactly the
keys (after rotary) and values the cache stores, of which a running max |x| per channel is kept.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from onnx_ir.passes.common import RemoveUnusedNodesPass

from converters.quantize.calibration_text import CalibrationText, windows
from engine_builder.formats import graph_io as io
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.quantization import CalibrationInfo
from engine_builder.network import MODEL_FILE, NetworkOptions, build_decoder
from engine_builder.network.weights import link_weights

# at these SmolLM2-135M (fp32) calibrates in 31 s of CPU (45..80 s wall on the shared 2-core dev machine),
# peak RSS ~1 GB
DEFAULT_SAMPLES = 32
DEFAULT_SEQ_LEN = 256
# tokens kept per linear for the AWQ search; AutoAWQ's search sees a few thousand, 512 is enough
# to rank 20 scale candidates and keeps the kept samples of a 30-layer model near 200 MB
SAMPLE_TOKENS = 512
SAMPLE_SEED = 0
# a tied lm_head multiplies by the embedding matrix; its statistics are still lm_head's
_LM_HEAD_WEIGHTS = {"embed.weight": "lm_head", "lm_head.weight": "lm_head"}

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class LinearInputStats:
    absmax: np.ndarray  # [in] f32, max |x| over every calibration token
    mean_abs: np.ndarray  # [in] f32, mean |x| over every calibration token
    sample: np.ndarray  # [n, in] f32, the same n tokens for every linear


@dataclass(frozen=True)
class CalibrationData:
    info: CalibrationInfo
    inputs: dict[str, LinearInputStats]  # linear prefix ("layers.3.attn.qkv", "lm_head") -> its input's stats
    # "layers.3.attn.k_cache" / "layers.3.attn.v_cache" -> max |x| [kv_heads, head_dim] f32 over every
    # calibration token; empty unless collect(caches=True)
    caches: dict[str, np.ndarray] = field(default_factory=dict)


def cache_names(layer: int) -> dict[str, str]:
    """Graph output -> the checkpoint prefix of its statistics (and scale, FORMAT.md) for LAYER's KV cache."""
    return {io.present_key(layer): f"layers.{layer}.attn.k_cache",
            io.present_value(layer): f"layers.{layer}.attn.v_cache"}


def linear_inputs(model: ir.Model) -> dict[str, ir.Value]:
    """Linear prefix -> the activation value it multiplies, for every linear of the decoder graph."""
    taps: dict[str, ir.Value] = {}
    for node in model.graph:
        transpose = node.inputs[1].producer() if node.op_type == "MatMul" else None
        if transpose is None or transpose.op_type != "Transpose":
            continue
        weight = transpose.inputs[0]
        while weight.producer() is not None and weight.producer().op_type == "Cast":  # a weight cast to f32
            weight = weight.producer().inputs[0]
        if weight.is_initializer() and weight.name.endswith(".weight"):
            prefix = _LM_HEAD_WEIGHTS.get(weight.name, weight.name.removesuffix(".weight"))
            taps[prefix] = node.inputs[0]
    return taps


def collect(fp_ckpt_dir: Path, text: CalibrationText, samples: int, seq_len: int,
            progress: Progress | None = None, caches: bool = False) -> CalibrationData:
    """Prefill SAMPLES windows of SEQ_LEN tokens of TEXT through FP_CKPT_DIR's float graph; stats per linear
    (and, with CACHES, per KV-cache channel).

    `progress(done, total)` hears after each window. Fewer windows than SAMPLES are used when
    the text is short; info.samples records how many.
    """
    fp_ckpt_dir = Path(fp_ckpt_dir)
    # a clear error for a dir that is not a checkpoint, before tokenizing
    num_layers = CheckpointConfig.load(fp_ckpt_dir).model.num_layers
    ids = windows(text, fp_ckpt_dir, samples, seq_len)  # [n, seq_len]
    model = build_decoder(fp_ckpt_dir, NetworkOptions(max_seq_len=seq_len, all_logits=True, dtype="float32"))
    taps = linear_inputs(model)
    presents = {}  # graph output name -> checkpoint prefix of its statistics
    if caches:
        presents = {name: prefix for i in range(num_layers) for name, prefix in cache_names(i).items()}
    by_name = {o.name: o for o in model.graph.outputs}
    kept = [by_name[name] for name in presents]
    # only the taps (and the presents asked for) are outputs: the logits are never computed or returned
    outputs = list(dict.fromkeys([*taps.values(), *kept]))
    model.graph.outputs.clear()
    model.graph.outputs.extend(outputs)
    RemoveUnusedNodesPass()(model)
    stats = _Accumulator(taps, ids.shape[0], seq_len)
    cache_absmax: dict[str, np.ndarray] = {}  # prefix -> running max |x| [kv_heads, head_dim]
    # beside the checkpoint so the weights are hard-linked, not copied (onnxruntime wants them in the model's dir)
    with tempfile.TemporaryDirectory(dir=fp_ckpt_dir.parent, prefix=f".{fp_ckpt_dir.name}.calib-") as tmp:
        link_weights(fp_ckpt_dir, Path(tmp))
        ir.save(model, Path(tmp) / MODEL_FILE)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        session = ort.InferenceSession(str(Path(tmp) / MODEL_FILE), options, providers=["CPUExecutionProvider"])
    # zero-filled, as graph_io asks; onnxruntime never writes its feeds (a present is a new array), so they are
    # shared by every window
    feeds = {i.name: np.zeros([1, *i.shape[1:]], np.float32) for i in session.get_inputs()
             if i.name.startswith(("past_key.", "past_value."))}
    feeds[io.POSITION_IDS] = np.arange(seq_len, dtype=np.int64)[None, :]  # [1, seq]
    feeds[io.PAST_LENGTHS] = np.zeros(1, np.int64)  # [1]
    names = [o.name for o in outputs]
    for w, window in enumerate(ids):
        feeds[io.INPUT_IDS] = window[None, :]  # [1, seq]
        values = dict(zip(names, session.run(names, feeds)))
        stats.add(w, values)
        for name, prefix in presents.items():
            # [1, kv_heads, seq_len, head_dim]: every slot is this window's (max_seq_len is seq_len)
            absmax = np.abs(values[name]).max(axis=(0, 2))  # [kv_heads, head_dim]
            cache_absmax[prefix] = np.maximum(cache_absmax[prefix], absmax) if prefix in cache_absmax else absmax
        if progress is not None:
            progress(w + 1, ids.shape[0])
    info = CalibrationInfo(source=text.source, sha256=text.sha256, samples=int(ids.shape[0]), seq_len=seq_len)
    return CalibrationData(info, stats.result(), {prefix: cache_absmax[prefix] for prefix in presents.values()})


def sample_positions(tokens: int) -> np.ndarray:
    """Which of TOKENS calibration tokens (windows one after another) make up every linear's `sample`.

    The same positions for every linear, spread over all windows by a fixed seed, in order."""
    rng = np.random.default_rng(SAMPLE_SEED)
    return np.sort(rng.choice(tokens, size=min(SAMPLE_TOKENS, tokens), replace=False))


class _Accumulator:
    """Running max |x|, sum |x| and the sampled tokens of each linear's input, one window at a time."""

    def __init__(self, taps: dict[str, ir.Value], windows: int, seq_len: int):
        self._value_of = {prefix: value.name for prefix, value in taps.items()}
        self._seq_len = seq_len
        self._tokens = windows * seq_len
        self._picks = sample_positions(self._tokens)
        self._absmax: dict[str, np.ndarray] = {}
        self._sum_abs: dict[str, np.ndarray] = {}
        self._sample: dict[str, np.ndarray] = {}

    def add(self, window: int, values: dict[str, np.ndarray]) -> None:
        start = window * self._seq_len
        picked = self._picks[(self._picks >= start) & (self._picks < start + self._seq_len)]
        rows = np.searchsorted(self._picks, picked)  # where these tokens go in the sample
        for prefix, name in self._value_of.items():
            x = values[name].reshape(-1, values[name].shape[-1])  # [seq, in]
            ax = np.abs(x)
            if prefix not in self._absmax:
                self._absmax[prefix] = np.zeros(x.shape[1], np.float32)
                self._sum_abs[prefix] = np.zeros(x.shape[1], np.float64)
                self._sample[prefix] = np.empty((len(self._picks), x.shape[1]), np.float32)
            np.maximum(self._absmax[prefix], ax.max(axis=0), out=self._absmax[prefix])
            self._sum_abs[prefix] += ax.sum(axis=0, dtype=np.float64)
            self._sample[prefix][rows] = x[picked - start]

    def result(self) -> dict[str, LinearInputStats]:
        return {prefix: LinearInputStats(absmax=self._absmax[prefix],
                                         mean_abs=(self._sum_abs[prefix] / self._tokens).astype(np.float32),
                                         sample=self._sample[prefix])
                for prefix in self._value_of}
