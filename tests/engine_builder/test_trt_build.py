"""Real TensorRT-RTX builds of small opset-24 graphs on this (GPU-less) machine."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")

from trt_graphs import LayerDims, decoder_layer_model, decoder_profiles, single_op_model  # noqa: E402

from engine_builder.trt import compat as trt_compat
from engine_builder.trt import compatibility
from engine_builder.trt.engine_build import (
    BuildCancelled,
    BuildProgress,
    EngineBuildError,
    EngineParseError,
    TrtBuildOptions,
    TrtBuildReport,
    build_engine,
)
from engine_builder.util.errors import InputError, UnsupportedError

TARGETS = ("sm80", "sm86")
NO_GPU = not compatibility.gpu_compute_capabilities()


def options(**overrides: object) -> TrtBuildOptions:
    base = {"compute_capabilities": TARGETS, "profiles": decoder_profiles()}
    return TrtBuildOptions(**(base | overrides))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def decoder_build(module_tmp_factory) -> tuple[TrtBuildReport, list[BuildProgress]]:
    """One decoder layer, two profiles (decode / prefill), built once for the module."""
    model = decoder_layer_model(module_tmp_factory.mktemp("decoder"))
    events: list[BuildProgress] = []
    report = build_engine(model, model.parent / "rank0.engine", options(), progress=events.append)
    return report, events


def test_decoder_layer_engine_and_report(decoder_build):
    report, _ = decoder_build
    assert report.engine_path.is_file()
    assert report.engine_path.stat().st_size == report.engine_bytes > 100_000
    assert report.flavour == "tensorrt_rtx" and report.trt_version.startswith("1.")
    assert report.targets == TARGETS and report.num_profiles == 2
    assert report.build_seconds > 0 and report.peak_rss_bytes > 0  # recorded; not a time bound (a loaded CI machine)
    assert not list(report.engine_path.parent.glob(".*tmp"))  # the temp file was renamed away
    info = compatibility.EngineBuildInfo.from_mapping(json.loads(json.dumps(report.to_json())))
    assert info == compatibility.EngineBuildInfo("tensorrt_rtx", report.trt_version, TARGETS)


def test_parser_maps_llm_ops_to_native_layers(decoder_build):
    report, _ = decoder_build
    layers = report.network_layer_types
    assert layers["ROTARY_EMBEDDING"] == 2  # q and k
    assert layers["KV_CACHE_UPDATE"] == 2  # TensorScatter on the k and v caches, updated in place
    assert layers["ATTENTION_INPUT"] == layers["ATTENTION_OUTPUT"] == 1


def test_engine_has_fused_attention_kernels_per_profile(decoder_build):
    report, _ = decoder_build
    assert report.layer_info_source in ("builder_log", "inspector")
    attention = {layer.tactic.split("_0x")[0] for layer in report.layers_for("0.attention")}
    assert "_gemv_mha_v1" in attention, attention  # decode profile: seq == 1
    assert "_gemm_mha_v2" in attention, attention  # prefill profile
    # rotary embedding and the KV-cache write run inside one generated kernel
    fused = [layer for layer in report.engine_layers
             if {"0.k_rope", "0.present_key"} <= set(layer.onnx_nodes)]
    assert fused and all(layer.layer_type == "kgen" for layer in fused)
    assert report.engine_layer_types["gemm"] >= 3  # q/k/v, gate/up and down projections


def test_nonpad_kv_seqlen_is_dropped_by_tensorrt_rtx(decoder_build, tmp_path):
    """TRT-RTX 1.7.1 builds Attention-24 with is_causal as an upper-left mask and ignores
    nonpad_kv_seqlen ('Unused Input'), so decode over a static cache needs an explicit mask.
    If this starts failing, TensorRT honours the input: revisit the TensorRT lowering."""
    report, _ = decoder_build
    assert report.unused_inputs == ("nonpad_kv_seqlen",)
    masked = decoder_layer_model(tmp_path, bool_mask=True)
    report = build_engine(masked, tmp_path / "rank0.engine",
                          options(compute_capabilities=("sm86",), profiles=decoder_profiles(bool_mask=True)))
    assert report.unused_inputs == ()
    assert any("mha" in layer.tactic for layer in report.layers_for("0.attention"))


def test_progress_reports_tensorrt_phases(decoder_build):
    _, events = decoder_build
    top = [e for e in events if e.kind == "start" and e.parent is None]
    assert [e.phase for e in top] == ["Parsing ONNX", "Building engine"]
    assert top[1].total > 0
    assert any(e.kind == "step" for e in events) and events[-1].kind == "finish"


def test_engine_header_records_version_and_targets(decoder_build):
    report, _ = decoder_build
    header = compatibility.read_rtx_header(report.engine_path)
    assert header is not None
    assert header.version == ".".join(report.trt_version.split(".")[:3])
    assert header.targets == TARGETS


def test_fp32_attention_is_rejected_with_a_hint(tmp_path, capfd):
    model = decoder_layer_model(tmp_path, dtype="float32")
    out = tmp_path / "rank0.engine"
    with pytest.raises(EngineBuildError, match="Attention operation was not supported by a dedicated kernel") as err:
        build_engine(model, out, options())
    message = str(err.value)
    assert "fp16/bf16" in message and "decomposable_attention" in message and "\n" not in message
    assert not out.exists()
    assert "Internal Error" not in capfd.readouterr().err  # Myelin's own stderr line was captured
    report = build_engine(model, out, options(decomposable_attention=True))
    assert out.is_file() and report.network_layer_types["ATTENTION_INPUT"] == 1


def test_unknown_compute_capability_lists_valid_ones(tmp_path):
    model = decoder_layer_model(tmp_path)
    with pytest.raises(InputError) as err:
        build_engine(model, tmp_path / "rank0.engine", options(compute_capabilities=("sm86", "sm_90")))
    assert "sm90" in str(err.value)
    assert "valid targets: sm75, sm80, sm86, sm89, sm120, sm121" in str(err.value)
    assert not (tmp_path / "rank0.engine").exists()


def test_unsupported_op_names_node_and_op(tmp_path):
    model = single_op_model(tmp_path, "Unique")
    with pytest.raises(EngineParseError) as err:
        build_engine(model, tmp_path / "rank0.engine", TrtBuildOptions())
    assert "node 'the_unique' (op Unique, #1)" in str(err.value)
    assert err.value.issues[0]["op_type"] == "Unique" and err.value.issues[0]["code"] == "UNSUPPORTED_NODE"


def test_unknown_custom_op_names_node_and_op(tmp_path):
    model = single_op_model(tmp_path, "NotAnOp", domain="example.custom")
    with pytest.raises(EngineParseError, match=r"node 'the_notanop' \(op NotAnOp, #1\).*Plugin not found"):
        build_engine(model, tmp_path / "rank0.engine", TrtBuildOptions())


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="full TensorRT is installed")
def test_missing_flavour_says_how_to_install(tmp_path):
    model = single_op_model(tmp_path, "Relu")
    with pytest.raises(UnsupportedError) as err:
        build_engine(model, tmp_path / "rank0.engine", TrtBuildOptions(flavour="tensorrt"))
    message = str(err.value)
    assert message.startswith("TensorRT is not installed")
    assert "pip install tensorrt-rtx-cu13" in message and "https://pypi.nvidia.com" in message


def test_profiles_must_cover_dynamic_inputs(tmp_path):
    model = decoder_layer_model(tmp_path)
    with pytest.raises(InputError, match="dynamic inputs .*hidden.*optimization profile"):
        build_engine(model, tmp_path / "e", options(profiles=()))
    partial = [{k: v for k, v in p.items() if k != "position_ids"} for p in decoder_profiles()]
    with pytest.raises(InputError, match="profile 0 gives no shapes for dynamic input.* position_ids"):
        build_engine(model, tmp_path / "e", options(profiles=partial))
    extra = [p | {"input_ids": ((1, 1), (1, 1), (1, 1))} for p in decoder_profiles()]
    with pytest.raises(InputError, match="profile 0 names input_ids, which the graph does not have"):
        build_engine(model, tmp_path / "e", options(profiles=extra))


@pytest.mark.skipif(not NO_GPU, reason="documents the CPU-only limitation")
def test_weight_stripping_needs_a_gpu_on_tensorrt_rtx(tmp_path):
    model = decoder_layer_model(tmp_path)
    with pytest.raises(EngineBuildError, match="refittable / weight-stripped engines only with a GPU"):
        build_engine(model, tmp_path / "rank0.engine", options(compute_capabilities=("sm86",), strip_weights=True))


def test_progress_callback_can_cancel(tmp_path):
    model = decoder_layer_model(tmp_path)

    def stop_when_building(event: BuildProgress) -> bool:
        return event.phase != "Building engine" or event.kind != "step"

    with pytest.raises(BuildCancelled):
        build_engine(model, tmp_path / "rank0.engine", options(), progress=stop_when_building)
    assert not (tmp_path / "rank0.engine").exists()


def test_bigger_layer_builds(tmp_path):
    """SmolLM2-135M's layer shape (hidden 576, 9/3 heads, head_dim 64) with a 512-slot cache."""
    dims = LayerDims(hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, max_seq=512)
    model = decoder_layer_model(tmp_path, dims, layers=2)
    report = build_engine(model, tmp_path / "rank0.engine",
                          options(profiles=decoder_profiles(dims, layers=2, prefill_opt=128)))
    weights = (tmp_path / "rank0.safetensors").stat().st_size
    assert report.engine_bytes > weights  # the plan embeds the weights (stripping needs a GPU)
    assert report.network_layer_types["KV_CACHE_UPDATE"] == 4


def test_normalize_cc_spellings():
    assert [trt_compat.normalize_cc(s) for s in ("sm_86", "SM86", "8.6", "86", "12.0")] == \
        ["sm86", "sm86", "sm86", "sm86", "sm120"]
