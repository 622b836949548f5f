"""`trtbuild build` and `trtbuild inspect`: real TensorRT-RTX engines for every architecture."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from cli_process import assert_user_error, trtbuild

from engine_builder.build.dtype_choice import cpu_has_fast_fp16
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import BuildConfig, Limits

SMALL = Limits(max_batch=2, max_input_len=16, max_seq_len=32)
TWO_TARGETS = ("sm80", "sm86")


def test_fp16_engine_for_every_architecture(arch, checkpoint_dir, tmp_path):
    out = tmp_path / "engine"
    result = build(checkpoint_dir(arch), out, BuildConfig(limits=SMALL, compute_capabilities=TWO_TARGETS))
    assert (out / "rank0.engine").stat().st_size == result.engine_bytes > 0
    layers = result.tensorrt["network_layer_types"]
    manifest = json.loads((out / "config.json").read_text())
    layers_count = manifest["model"]["num_layers"]
    # fused layers, not their decomposition: TensorRT made native attention/rotary/cache-update layers
    assert layers["ROTARY_EMBEDDING"] == layers["KV_CACHE_UPDATE"] == 2 * layers_count
    assert "SCATTER" not in layers
    # TensorRT's Attention has no softcap: stays decomposed
    if manifest["model"]["block"]["attention"]["logit_softcap"]:
        assert "ATTENTION_INPUT" not in layers and layers["SOFTMAX"] == layers_count
    else:
        assert layers["ATTENTION_INPUT"] == layers["ATTENTION_OUTPUT"] == layers_count
        assert "SOFTMAX" not in layers
    assert result.tensorrt["targets"] == list(TWO_TARGETS) and result.tensorrt["num_profiles"] == 3  # + verify
    assert result.tensorrt["unused_inputs"] == []


def test_manifest_is_complete(checkpoint_dir, tmp_path):
    out = tmp_path / "engine"
    build(checkpoint_dir("qwen3"), out, BuildConfig(limits=SMALL, compute_capabilities=TWO_TARGETS))
    m = json.loads((out / "config.json").read_text())
    assert m["schema"] == "trtbuild.engine" and m["schema_version"] == 2
    assert m["versions"]["trtbuild"] and m["versions"]["onnxruntime"]
    assert m["versions"]["tensorrt"]["flavour"] == "tensorrt_rtx" and m["versions"]["tensorrt"]["trt_version"]
    assert m["build"]["dtype"] == "float16" and m["build"]["limits"] == vars(SMALL)
    # --dtype auto: the twin runs on this CPU, in float32 unless it has native float16 (build/dtype_choice.py)
    twin = "float16" if cpu_has_fast_fp16() else "float32"
    assert m["build"]["twin_dtype"] == twin and f"twin {twin}" in m["dtype_choice"]
    assert _graph_input_type(out / "model.onnx", "past_key.0") == twin
    assert _graph_input_type(out / "model.trt.onnx", "past_key.0") == "float16"
    assert m["build"]["compute_capabilities"] == list(TWO_TARGETS)
    assert [len(p["input_ids"]) for p in m["tensorrt"]["profiles"]] == [3, 3, 3]  # min/opt/max per profile
    assert m["tensorrt"]["profiles"][0]["input_ids"] == [[1, 1], [1, 1], [2, 1]]  # decode: seq 1
    # speculative verify: the last token + up to logits_tail - 1 drafts (logits_tail 16, capped at max_input_len)
    assert m["tensorrt"]["profiles"][1]["input_ids"] == [[1, 2], [1, 16], [2, 16]]
    assert m["build"]["logits_tail"] == 16
    assert {r["name"]: r["matches"] for r in m["passes"]["tensorrt"]}["fuse_attention"] == 2
    assert m["checkpoint"]["source"]["files"][0]["sha256"]
    assert set(m["graph_hashes"]) == {"onnxruntime", "tensorrt"}
    # peak RSS above the start can be 0 for a tiny model when freed memory is reused
    assert m["cost"]["build_seconds"] > 0 and isinstance(m["cost"]["peak_rss_bytes"], int)
    assert {"model.onnx", "model.trt.onnx", "rank0.engine", "rank0.safetensors", "generation_config.json"} <= {
        f.name for f in out.iterdir()}
    # the engine's own weights (a reflink or a copy): editing the checkpoint cannot reach them
    assert not os.path.samefile(out / "rank0.safetensors", checkpoint_dir("qwen3") / "rank0.safetensors")
    recorded = {f["name"]: f for f in m["files"]}  # what every load checks (tests/runner/test_engine_integrity.py)
    assert {"model.onnx", "model.trt.onnx", "rank0.engine", "rank0.safetensors"} <= set(recorded)
    assert recorded["rank0.engine"]["size"] == (out / "rank0.engine").stat().st_size
    assert recorded["model.onnx"]["sha256"] == m["graph_hashes"]["onnxruntime"]


def _graph_input_type(path: Path, name: str) -> str:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    value = next(i for i in graph.input if i.name == name)
    return onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name


def test_inspect_verdict_here_is_no_gpu(checkpoint_dir, tmp_path):
    out = tmp_path / "engine"
    proc = trtbuild("build", checkpoint_dir("llama"), out, "--cc", "sm86,sm89", "--max-batch", "2",
               "--max-input-len", "16", "--max-seq-len", "32", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine_bytes"] > 0
    info = trtbuild("inspect", out, "--json")
    assert info.returncode == 0, info.stderr
    verdict = json.loads(info.stdout)["verdict"]
    assert verdict["tensorrt"]["ok"] is False
    assert verdict["tensorrt"]["reason"].startswith("cannot run here: no NVIDIA GPU")
    assert verdict["onnxruntime"]["ok"] is True
    assert verdict["torch"] == {"ok": False, "reason": "no CUDA GPU here (`--backend torch` runs it on the CPU, in "
                                                       "float32)"}
    text = trtbuild("inspect", out)
    assert text.returncode == 0 and "ROTARY_EMBEDDING" in text.stdout and "no NVIDIA GPU" in text.stdout
    assert "torch here" in text.stdout
    assert "engine float16, onnxruntime twin" in text.stdout and "--dtype auto" in text.stdout


def test_explain_passes_names_why_a_pass_found_nothing(checkpoint_dir, tmp_path):
    args = ("build", checkpoint_dir("llama"), tmp_path / "e", "--target", "onnxruntime", "--explain-passes",
            "--max-seq-len", "32", "--max-input-len", "16")
    proc = trtbuild(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    report = {r["name"]: r for r in json.loads(proc.stdout)["passes"]["onnxruntime"]}
    assert report["fuse_attention"]["matches"] == 2 and report["fuse_attention"]["why_not"] is None
    assert report["fuse_qkv"]["matches"] == 0 and "fused qkv weight" in report["fuse_qkv"]["why_not"]
    table = trtbuild(*args[:2], tmp_path / "f", *args[3:])
    assert table.returncode == 0 and "passes for onnxruntime" in table.stdout and "fuse_rotary" in table.stdout


def test_recipe_reproduces_graph_hash(checkpoint_dir, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"model": "tiny llama", "build": {
        "targets": ["onnxruntime"], "dtype": "float32", "limits": vars(SMALL)}}))
    a = trtbuild("build", checkpoint_dir("llama"), tmp_path / "a", "--recipe", recipe, "--json")
    b = trtbuild("build", checkpoint_dir("llama"), tmp_path / "b", "--target", "onnxruntime", "--dtype", "float32",
            "--max-batch", "2", "--max-input-len", "16", "--max-seq-len", "32", "--json")
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    assert json.loads(a.stdout)["graph_hashes"] == json.loads(b.stdout)["graph_hashes"]
    c = trtbuild("build", checkpoint_dir("llama"), tmp_path / "c", "--recipe", recipe, "--set", "limits.max_seq_len=64",
            "--json")
    assert json.loads(c.stdout)["graph_hashes"] != json.loads(a.stdout)["graph_hashes"]


@pytest.mark.parametrize("args,needles", [
    (["--max-input-len", "64", "--max-seq-len", "32"], ["max_input_len 64 exceeds max_seq_len 32"]),
    (["--max-batch", "0"], ["max_batch must be a positive integer"]),
    (["--cc", "sm90"], ["sm90", "sm80"]),
    (["--trt-flavour", "tensorrt"], ["pip install"]),
    (["--set", "passes.tensorrt=[fuse_everything]"], ["unknown pass 'fuse_everything'", "fuse_rotary"]),
    (["--set", "limits.max_seqlen=5"], ["unknown key 'max_seqlen'", "max_seq_len"]),
    (["--weights", "stripped", "--cc", "sm86"], ["weight-stripped engines only with a GPU"]),
    (["--weights", "shared"], ["weights 'shared' is not one of embedded, refittable, stripped"]),
])
def test_bad_build_input(checkpoint_dir, tmp_path, args, needles):
    out = tmp_path / "engine"
    assert_user_error(trtbuild("build", checkpoint_dir("llama"), out, *args), *needles)
    assert not out.exists() and not list(tmp_path.glob(".engine.*"))


def test_unknown_recipe_key_lists_valid_keys(checkpoint_dir, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("build:\n  max_sequence: 5\n")
    assert_user_error(trtbuild("build", checkpoint_dir("llama"), tmp_path / "e", "--recipe", recipe),
                      "unknown key(s) max_sequence", "limits")


def test_inspect_refuses_corrupt_or_foreign_dirs(checkpoint_dir, tmp_path):
    assert_user_error(trtbuild("inspect", checkpoint_dir("llama")), "not a trtbuild engine dir")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    assert_user_error(trtbuild("inspect", bad), "not valid JSON")
    assert_user_error(trtbuild("inspect", tmp_path / "missing"), "does not exist")


def test_ort_only_op_in_tensorrt_graph_names_node_and_pass(checkpoint_dir, tmp_path):
    import onnx_ir as ir

    from engine_builder.build.target_check import check_target_ops
    from engine_builder.network import NetworkOptions, build_decoder
    from engine_builder.util.errors import UnsupportedError

    model = build_decoder(checkpoint_dir("llama"), NetworkOptions(max_seq_len=32))
    node = next(n for n in model.graph if n.op_type == "Softmax")
    node.domain, node.op_type = "com.microsoft", "GroupQueryAttention"
    with pytest.raises(UnsupportedError, match=rf"node '{node.name}' is com.microsoft.GroupQueryAttention.*"
                                               r"lower_ort_attention"):
        check_target_ops(model, "tensorrt")
    assert isinstance(model, ir.Model)


def test_smollm2_fp16_engine(smollm2_gguf, tmp_path):
    from converters.convert import convert

    base = tmp_path
    convert(smollm2_gguf, base / "ckpt")
    result = build(base / "ckpt", base / "engine", BuildConfig(
        limits=Limits(max_batch=2, max_input_len=128, max_seq_len=256), compute_capabilities=TWO_TARGETS))
    layers = result.tensorrt["network_layer_types"]
    assert layers["ATTENTION_INPUT"] == 30 and layers["ROTARY_EMBEDDING"] == layers["KV_CACHE_UPDATE"] == 60
    assert result.engine_bytes > 200e6  # fp16 weights live in the engine (no weight stripping on CPU)
    assert Path(base / "engine" / "model.onnx").stat().st_size < 2e6  # the twin references the weights
