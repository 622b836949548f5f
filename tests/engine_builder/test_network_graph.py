"""The decoder graph's form: I/O contract, canonical ops only, weights by reference, errors."""

from __future__ import annotations

import collections
import errno
import filecmp
import json
import os
import shutil

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from safetensors.numpy import load_file

from engine_builder.network import IR_VERSION, OPSET, NetworkOptions, build_decoder, write_onnx
from engine_builder.network import weights as weights_module
from engine_builder.util.errors import ConfigError, InputError

# what a generic exporter emits; fused ops (RMSNormalization, RotaryEmbedding, Attention,
# TensorScatter, com.microsoft.*) are for the rewrite passes to introduce
CANONICAL_OPS = {
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Tanh", "Sigmoid", "Gelu", "Cos", "Sin",
    "ReduceMean", "ReduceMax", "Softmax", "MatMul", "Transpose", "Reshape", "Unsqueeze", "Expand", "Concat",
    "Split", "Gather", "Slice", "Cast", "Shape", "ConstantOfShape", "CumSum", "Where", "Greater",
    "LessOrEqual", "And", "ScatterND",
}


def dims(value_info: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def llama_onnx(checkpoint_dir, module_tmp_factory):
    ckpt = checkpoint_dir("llama")
    return ckpt, write_onnx(ckpt, module_tmp_factory.mktemp("llama-onnx"), NetworkOptions(max_seq_len=96))


def test_io_contract(llama_onnx, tmp_path):
    _, path = llama_onnx
    model = onnx.load(path, load_external_data=False)
    assert model.ir_version == IR_VERSION
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    kv = ["batch", 2, 96, 16]  # [batch, kv_heads, max_seq, head_dim]
    assert {i.name: (i.type.tensor_type.elem_type, dims(i)) for i in model.graph.input} == {
        "input_ids": (onnx.TensorProto.INT64, ["batch", "seq"]),
        "position_ids": (onnx.TensorProto.INT64, ["batch", "seq"]),
        "past_lengths": (onnx.TensorProto.INT64, ["batch"]),
        **{f"past_{kind}.{i}": (onnx.TensorProto.FLOAT, kv) for i in range(2) for kind in ("key", "value")}}
    assert [(o.name, o.type.tensor_type.elem_type, dims(o)) for o in model.graph.output] == [
        ("logits", onnx.TensorProto.FLOAT, ["batch", 1, 320]),
        *((f"present_{kind}.{i}", onnx.TensorProto.FLOAT, kv) for i in range(2) for kind in ("key", "value"))]

    # onnx (like onnx_ir) refuses to read external data from a file with several hard links, a
    # guard against hard-link attacks; check a copy (onnxruntime accepts the link itself)
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copyfile(path, copy / "model.onnx")
    shutil.copyfile(path.parent / "rank0.safetensors", copy / "rank0.safetensors")
    onnx.checker.check_model(copy / "model.onnx", full_check=True)


def test_all_logits_output_covers_every_position(checkpoint_dir):
    model = build_decoder(checkpoint_dir("llama"), NetworkOptions(max_seq_len=32, all_logits=True))
    assert list(model.graph.outputs[0].shape) == ["batch", "seq", 320]


@pytest.mark.parametrize("name", ["llama", "gemma3_text", "phi3", "llama_dynamic"])
def test_only_canonical_ops_in_regular_numbers(checkpoint_dir, name):
    model = build_decoder(checkpoint_dir(name), NetworkOptions(max_seq_len=32))
    ops = collections.Counter(node.op_type for node in model.graph)
    assert {node.domain for node in model.graph} == {""}
    assert set(ops) <= CANONICAL_OPS, set(ops) - CANONICAL_OPS
    layers = len([v for v in model.graph.inputs if v.name.startswith("past_key.")])
    norms_per_layer = {"gemma3_text": 6, "llama": 2, "phi3": 2, "llama_dynamic": 2}[name]  # + q/k and sandwich norms
    assert ops["MatMul"] == 6 * layers + 1  # qkv, q.kT, p.v, o, gate_up, down; lm_head
    assert ops["Softmax"] == layers and ops["ScatterND"] == 2 * layers
    assert ops["ReduceMean"] == norms_per_layer * layers + 1
    # every value has a dtype and a shape whose only unknowns are the named dims
    for node in model.graph:
        for out in node.outputs:
            assert out.dtype is not None and out.shape is not None, out.name
            assert all(isinstance(d, int) or d.value in ("batch", "seq") for d in out.shape), (out.name, out.shape)


def test_weights_are_references_into_the_linked_safetensors(llama_onnx):
    ckpt, path = llama_onnx
    weights = path.parent / "rank0.safetensors"
    assert os.path.samefile(weights, ckpt / "rank0.safetensors")  # hard link, no copy
    assert path.stat().st_size < 200_000  # just the graph and a few small tables
    stored = load_file(ckpt / "rank0.safetensors")
    header_len = int.from_bytes(weights.read_bytes()[:8], "little")
    header = json.loads(weights.read_bytes()[8:8 + header_len])
    model = onnx.load(path, load_external_data=False)
    external = {t.name: {e.key: e.value for e in t.external_data} for t in model.graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL}
    assert set(external) == set(stored)
    for name, info in external.items():
        begin, end = header[name]["data_offsets"]
        assert info == {"location": "rank0.safetensors", "offset": str(8 + header_len + begin),
                        "length": str(end - begin)}
    with open(weights, "rb") as f:
        info = external["layers.1.mlp.down.weight"]
        f.seek(int(info["offset"]))
        raw = np.frombuffer(f.read(int(info["length"])), np.float32)
    np.testing.assert_array_equal(raw.reshape(64, 96), stored["layers.1.mlp.down.weight"])


def test_building_reads_no_weight_bytes(checkpoint_dir, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weight bytes were read")

    for method in ("_load", "numpy", "tobytes", "__array__"):
        monkeypatch.setattr(ir.ExternalTensor, method, refuse)
    write_onnx(checkpoint_dir("gemma2"), tmp_path, NetworkOptions(max_seq_len=32))


def test_copy_only_across_filesystems(checkpoint_dir, tmp_path, monkeypatch):
    ckpt = checkpoint_dir("qwen3")

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(weights_module.os, "link", cross_device)
    write_onnx(ckpt, tmp_path / "copied", NetworkOptions(max_seq_len=32))
    copied = tmp_path / "copied" / "rank0.safetensors"
    assert not os.path.samefile(copied, ckpt / "rank0.safetensors")
    assert filecmp.cmp(copied, ckpt / "rank0.safetensors", shallow=False)

    def no_permission(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(weights_module.os, "link", no_permission)
    with pytest.raises(PermissionError):
        write_onnx(ckpt, tmp_path / "refused", NetworkOptions(max_seq_len=32))
    assert not (tmp_path / "refused" / "model.onnx").exists()


def test_rewriting_an_output_dir_replaces_the_model(checkpoint_dir, tmp_path):
    ckpt = checkpoint_dir("llama_tied")
    write_onnx(ckpt, tmp_path, NetworkOptions(max_seq_len=32))
    write_onnx(ckpt, tmp_path, NetworkOptions(max_seq_len=48))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "rank0.safetensors"]
    assert dims(onnx.load(tmp_path / "model.onnx", load_external_data=False).graph.input[3])[2] == 48


def _edited_checkpoint(src, dst, edit):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_errors_say_what_to_do(checkpoint_dir, tmp_path):
    ckpt = checkpoint_dir("llama")
    with pytest.raises(ConfigError, match="max_seq_len"):
        build_decoder(ckpt, NetworkOptions(max_seq_len=0))
    with pytest.raises(ConfigError, match="trtbuild convert"):
        build_decoder(tmp_path, NetworkOptions())
    missing = _edited_checkpoint(ckpt, tmp_path / "bias",
                                 lambda c: c["model"]["block"]["attention"].update(o_bias=True))
    with pytest.raises(InputError, match="layers.0.attn.o.bias"):
        build_decoder(missing, NetworkOptions())
    quantized = _edited_checkpoint(ckpt, tmp_path / "q", lambda c: c.update(quantization={"scheme": "int4"}))
    with pytest.raises(ConfigError, match="scheme: expected one of .*'int4_wo'.*got 'int4'"):
        write_onnx(quantized, tmp_path / "out", NetworkOptions())  # refused as the config is read
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["gemma3_text", "phi3"])
def test_tensorrt_rtx_builds_the_unfused_graph(checkpoint_dir, tmp_path, name):
    """The portable form is already buildable (no GPU needed): fp16, hard-linked weights, two profiles."""
    pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")
    from engine_builder.trt.engine_build import TrtBuildOptions, build_engine

    path = write_onnx(checkpoint_dir(name, "float16"), tmp_path / "onnx", NetworkOptions(max_seq_len=64))
    model = onnx.load(path, load_external_data=False)

    def profile(batch: tuple[int, int, int], seq: tuple[int, int, int]) -> dict:
        def shape(value, k):
            return tuple({"batch": batch[k], "seq": seq[k]}.get(d, d) for d in dims(value))
        return {v.name: tuple(shape(v, k) for k in range(3)) for v in model.graph.input}

    decode, prefill = profile((1, 2, 4), (1, 1, 1)), profile((1, 1, 2), (2, 16, 64))
    report = build_engine(path, tmp_path / "rank0.engine", TrtBuildOptions(
        compute_capabilities=("sm86",), profiles=(decode, prefill), opt_level=0))
    assert report.engine_bytes > 0 and not report.unused_inputs
    assert report.network_layer_types["SCATTER"] == len(model.graph.input) - 3  # one per past_key/value
