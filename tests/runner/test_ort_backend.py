"""The onnxruntime backend: IO binding over preallocated buffers, in-place vs copy KV, session options."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from runner_engines import GQA_PASSES, build_engine

from engine_builder.formats import graph_io as io
from engine_builder.formats.manifest import EngineManifest
from engine_builder.formats.ort_graph_levels import OPTIMIZATION_LEVELS
from engine_builder.formats.ort_prepacked import META_PREPACKED_FOR, cpu_signature
from engine_builder.runner import ort_backend
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.ort_backend import OrtBackend, kv_update_mode
from engine_builder.util.cpu_cores import _cores_from_cpuinfo, physical_cores
from engine_builder.util.errors import UnsupportedError

PROMPTS = [[1, 5, 9, 14, 200], [1, 7], [1, 30, 31, 32, 33, 34, 35, 36]]


def _reference(model_path, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy by plain session.run, present_* as fresh outputs fed back: the graph's copy semantics."""
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    past = [i for i in session.get_inputs() if i.name.startswith(("past_key.", "past_value."))]
    cache = {i.name: np.zeros([1, *i.shape[1:]], np.float32) for i in past}
    names = [o.name for o in session.get_outputs()]
    length, ids, tokens, logits_seen = 0, prompt, [], []
    for _ in range(steps):
        feeds = {io.INPUT_IDS: np.array([ids]), io.POSITION_IDS: np.arange(length, length + len(ids))[None],
                 io.PAST_LENGTHS: np.array([length]), **cache}
        out = session.run(None, feeds)
        cache = {n.replace("present_", "past_"): v for n, v in zip(names[1:], out[1:])}
        length += len(ids)
        logits_seen.append(out[0][0, -1])
        tokens.append(int(out[0][0, -1].argmax()))
        ids = [tokens[-1]]
    return tokens, logits_seen


def _run_backend(backend: OrtBackend, steps: int) -> tuple[list[list[int]], list[list[np.ndarray]]]:
    """Each prompt prefilled alone into its slot (in reverse order), then batched greedy decode."""
    kv = backend.kv
    tokens: list[list[int]] = [[] for _ in PROMPTS]
    seen: list[list[np.ndarray]] = [[] for _ in PROMPTS]
    for r in reversed(range(len(PROMPTS))):
        assert kv.allocate(f"r{r}", len(PROMPTS[r]), steps) == len(PROMPTS) - 1 - r
    slot = {r: len(PROMPTS) - 1 - r for r in range(len(PROMPTS))}
    for r, p in enumerate(PROMPTS):
        logits = backend.step(slot[r], np.array([p]))
        kv.advance(slot[r], len(p))
        seen[r].append(logits[0].copy())
        tokens[r].append(int(logits[0].argmax()))
    for _ in range(steps - 1):
        ids = np.zeros((len(PROMPTS), 1), np.int64)
        for r in range(len(PROMPTS)):
            ids[slot[r], 0] = tokens[r][-1]
        logits = backend.step(0, ids)
        for r in range(len(PROMPTS)):
            kv.advance(slot[r], 1)
            seen[r].append(logits[slot[r]].copy())
            tokens[r].append(int(logits[slot[r]].argmax()))
    return tokens, seen


@pytest.mark.parametrize("passes,mode", [(None, None), (GQA_PASSES, None), (None, "copy"), (GQA_PASSES, "copy")])
def test_backend_matches_plain_session_run(passes, mode, tiny_engine):
    engine, _ = tiny_engine("llama", ort_passes=passes)
    backend = OrtBackend(EngineDir.load(engine), kv_update=mode)
    assert backend.kv_update == (mode or "in_place")
    tokens, seen = _run_backend(backend, steps=8)
    for r, prompt in enumerate(PROMPTS):
        ref_tokens, ref_logits = _reference(engine / "model.onnx", prompt, 8)
        assert tokens[r] == ref_tokens
        np.testing.assert_allclose(np.array(seen[r]), np.array(ref_logits), atol=2e-5, rtol=1e-5)


def test_no_allocation_per_token_and_cache_written_in_place(tiny_engine):
    engine, _ = tiny_engine("llama", ort_passes=GQA_PASSES)
    backend = OrtBackend(EngineDir.load(engine))
    kv = backend.kv
    addresses = [k.ctypes.data for k in kv.keys] + [v.ctypes.data for v in kv.values]
    slot = kv.allocate("a", 4, 20)
    logits = backend.step(slot, np.array([[1, 2, 3, 4]]))
    kv.advance(slot, 4)
    assert np.abs(kv.keys[0][slot, :, :4]).sum() > 0  # the graph wrote straight into our buffer
    assert not kv.keys[0][slot, :, 4:].any()
    buffer = backend._logits.ctypes.data  # the prefill's last position lies inside the same buffer
    assert buffer <= logits.ctypes.data < buffer + backend._logits.nbytes
    logits_address = buffer
    for step in range(10):
        logits = backend.step(0, np.array([[5 + step]]))
        kv.advance(slot, 1)
        assert logits.ctypes.data == logits_address  # the same preallocated logits buffer
    assert [k.ctypes.data for k in kv.keys] + [v.ctypes.data for v in kv.values] == addresses
    assert len(backend._decode_bindings) == 1  # one binding, reused by every decode step
    assert np.abs(kv.keys[1][slot, :, 13]).sum() > 0 and not kv.keys[1][slot, :, 14:].any()
    backend.release(slot)
    assert not any(k.any() for k in kv.keys)  # freed slots go back to zeros


def _multi_row_step_over_a_cache(backend: OrtBackend) -> tuple[np.ndarray, list[np.ndarray]]:
    """Slots 0 and 1 prefilled alone (5 and 2 tokens), then one 3-token step of both rows at once: the step
    CPU GroupQueryAttention refuses. Its logits [2, tail, vocab] and slot 0-1's key caches."""
    kv = backend.kv
    for slot, prompt in enumerate(PROMPTS[:2]):
        assert kv.allocate(f"r{slot}", len(prompt), 8) == slot
        backend.step(slot, np.array([prompt]))
        kv.advance(slot, len(prompt))
    backend.bind(0, np.array([[3, 4, 5], [6, 7, 8]]))
    backend.execute()
    return backend.read_tail_logits().copy(), [k[:2].copy() for k in kv.keys]


def test_multi_row_step_over_a_cache_runs_a_row_a_call(tiny_engine):
    """The shipped twin has GQA without its fallback branch (passes/drop_ort_attention_fallback.py): a step of
    several rows and tokens over a non-empty cache runs one row per call, into the same buffers, and gives
    what the graph with the fallback gives in one call."""
    split = OrtBackend(EngineDir.load(tiny_engine("llama")[0]))
    fallback = OrtBackend(EngineDir.load(tiny_engine("llama", ort_passes=GQA_PASSES)[0]))
    assert split.rows_per_call and not fallback.rows_per_call
    logits, keys = _multi_row_step_over_a_cache(split)
    assert split._row_bindings is not None and len(split._row_bindings) == 2
    expected_logits, expected_keys = _multi_row_step_over_a_cache(fallback)
    assert fallback._row_bindings is None
    assert logits.shape == expected_logits.shape == (2, 3, split.vocab_size)
    np.testing.assert_allclose(logits, expected_logits, atol=2e-5, rtol=1e-5)
    for got, want in zip(keys, expected_keys):
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    split.bind(0, np.array([[9], [10]]))  # decode: one call again
    assert split._row_bindings is None


def test_kv_update_mode_from_graph_and_metadata(tiny_engine, tmp_path):
    default, _ = tiny_engine("llama")
    gqa, _ = tiny_engine("llama", ort_passes=GQA_PASSES)
    assert kv_update_mode(default / "model.onnx")[0] == "in_place"
    mode, why = kv_update_mode(gqa / "model.onnx")
    assert mode == "in_place" and "GroupQueryAttention" in why
    # the build recorded both in the graph's metadata, where a load reads them without importing onnx
    meta = {p.key: p.value for p in onnx.load(str(gqa / "model.onnx"), load_external_data=False).metadata_props}
    assert (meta["trtbuild.kv_update"], meta["trtbuild.kv_update_reason"]) == (mode, why)
    assert OrtBackend(EngineDir.load(gqa)).kv_update_reason == why
    # a producer we know nothing about: copy semantics
    shape = [None, 2, 8, 4]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["past_key.0"], ["present_key.0"]),
         helper.make_node("Identity", ["past_value.0"], ["present_value.0"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("past_key.0", "past_value.0")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("present_key.0", "present_value.0")])
    model = helper.make_model(graph)
    onnx.save(model, tmp_path / "identity.onnx")
    mode, why = kv_update_mode(tmp_path / "identity.onnx")
    assert mode == "copy" and "Identity" in why
    helper.set_model_props(model, {"trtbuild.kv_update": "in_place"})
    onnx.save(model, tmp_path / "flagged.onnx")
    assert kv_update_mode(tmp_path / "flagged.onnx") == ("in_place", "model metadata trtbuild.kv_update=in_place")


def test_session_uses_physical_cores_and_the_level_for_its_dtype(tiny_engine, monkeypatch):
    engine, _ = tiny_engine("llama")
    # the build's prepacked twin, optimized at the float32 level when it was saved: loaded as it is
    backend = OrtBackend(EngineDir.load(engine))
    assert backend.session.get_modelmeta().custom_metadata_map[META_PREPACKED_FOR] == cpu_signature()
    options = backend.session.get_session_options()
    assert options.intra_op_num_threads == physical_cores()
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # packed on another CPU or onnxruntime: model.onnx, optimized at load
    monkeypatch.setattr(ort_backend, "cpu_signature", lambda: "onnxruntime 0.0; another cpu")
    backend = OrtBackend(EngineDir.load(engine))
    assert META_PREPACKED_FOR not in backend.session.get_modelmeta().custom_metadata_map
    assert backend.session.get_session_options().graph_optimization_level == OPTIMIZATION_LEVELS["float32"]


def test_one_spinning_decision_whichever_graph_opens(tiny_engine, monkeypatch):
    """A prepacked graph packed on another CPU is opened, then dropped for model.onnx: both under one decision, so
    the dropped one's threads are not counted as spinning against model.onnx's (on 2 CPUs they were, and an
    engine built elsewhere decoded without spinning)."""
    engine, _ = tiny_engine("llama")
    decisions = []
    real = ort_backend.allow_spinning
    monkeypatch.setattr(ort_backend, "allow_spinning", lambda *a, **k: decisions.append(a) or real(*a, **k))
    monkeypatch.setattr(ort_backend, "cpu_signature", lambda: "onnxruntime 0.0; another cpu")
    backend = OrtBackend(EngineDir.load(engine))
    assert META_PREPACKED_FOR not in backend.session.get_modelmeta().custom_metadata_map
    assert len(decisions) == 1, decisions


def test_the_prepacked_twin_gives_the_logits_of_model_onnx(tiny_engine):
    """model.prepacked.onnx (written by the build for float32 twins) steps exactly as model.onnx does."""
    engine, _ = tiny_engine("llama")
    assert {"model.prepacked.onnx", "model.prepacked.onnx.data"} <= {d.name for d in
                                                                      EngineManifest.load(engine).files}
    packed = OrtBackend(EngineDir.load(engine))
    plain = OrtBackend(EngineDir.load(engine), optimization_level=OPTIMIZATION_LEVELS["float32"])
    assert META_PREPACKED_FOR in packed.session.get_modelmeta().custom_metadata_map
    assert META_PREPACKED_FOR not in plain.session.get_modelmeta().custom_metadata_map
    (tokens, seen), (ref_tokens, ref_seen) = _run_backend(packed, steps=8), _run_backend(plain, steps=8)
    assert tokens == ref_tokens
    for got, want in zip(seen, ref_seen):
        np.testing.assert_array_equal(np.array(got), np.array(want))


def test_physical_cores_counts_cores_not_hyperthreads(tmp_path):
    blocks = [f"processor\t: {i}\nphysical id\t: {i // 4}\ncore id\t\t: {i % 4 // 2}\n" for i in range(8)]
    (tmp_path / "cpuinfo").write_text("\n".join(blocks))
    assert _cores_from_cpuinfo(tmp_path / "cpuinfo") == 4  # 2 sockets x 2 cores x 2 threads
    assert _cores_from_cpuinfo(tmp_path / "missing") is None
    assert 1 <= physical_cores() <= (__import__("os").cpu_count() or 1)


@pytest.mark.parametrize("dtype,atol", [("float32", 1e-3), ("float16", 0.15)])
def test_shipped_optimization_level_matches_no_optimization(dtype, atol, smollm2_ckpt, smollm2_engine):
    """The level we ship for each dtype gives the logits of ORT_DISABLE_ALL on the real model
    (DESIGN §4: EXTENDED is known to corrupt some fp16 graphs; this is where that would show)."""
    engine = smollm2_engine if dtype == "float32" else smollm2_ckpt.parent / "engine-fp16"
    if not engine.exists():
        build_engine(smollm2_ckpt, engine, dtype=dtype)
    logits = {}
    for name, level in (("shipped", None), ("none", ort.GraphOptimizationLevel.ORT_DISABLE_ALL)):
        backend = OrtBackend(EngineDir.load(engine), optimization_level=level)
        slot = backend.kv.allocate("r", 6, 4)
        out = [backend.step(slot, np.array([[1, 504, 3458, 282, 4649, 314]]))[0].copy()]
        backend.kv.advance(slot, 6)
        for token in (7042, 30, 198):
            out.append(backend.step(slot, np.array([[token]]))[0].copy())
            backend.kv.advance(slot, 1)
        logits[name] = np.array(out)
        backend.close()
    assert np.abs(logits["shipped"] - logits["none"]).max() < atol
    assert (logits["shipped"].argmax(-1) == logits["none"].argmax(-1)).all()


def test_unloadable_model_is_a_clear_error(tiny_engine, tmp_path):
    engine, _ = tiny_engine("llama")
    broken = tmp_path / "engine"
    shutil.copytree(engine, broken)
    (broken / "model.onnx").write_bytes(b"not an onnx model")
    (broken / "model.prepacked.onnx").unlink()  # the shortcut it would load instead
    with pytest.raises(UnsupportedError, match=r"cannot load .*model.onnx.*rebuild the engine dir"):
        OrtBackend(EngineDir.load(broken, verify=False))  # verified, the load refuses it first (its sha256)
