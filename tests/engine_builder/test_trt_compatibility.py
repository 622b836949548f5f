"""Compatibility verdicts and layer-information parsing, without deserializing an engine."""

from __future__ import annotations

import json

import pytest

from engine_builder.trt import compatibility, engine_layers
from engine_builder.trt.compatibility import EngineBuildInfo, compatibility_verdict

BUILT = EngineBuildInfo("tensorrt_rtx", "1.7.1.116", ("sm80", "sm86"))


def test_no_gpu_means_cannot_run_here():
    ok, reason = compatibility_verdict(BUILT, gpus=[], installed="1.7.1.116")
    assert not ok and reason == "cannot run here: no NVIDIA GPU (no CUDA driver found)"


def test_gpu_outside_targets():
    ok, reason = compatibility_verdict(BUILT, gpus=["9.0"], installed="1.7.1.116")
    assert not ok and reason == "compute capability 9.0 not among targets sm80,sm86"


def test_version_mismatch_and_every_problem_named():
    ok, reason = compatibility_verdict(BUILT, gpus=[], installed="1.8.0.3")
    assert not ok
    assert reason == ("built with TensorRT-RTX 1.7.1, installed 1.8.0: rebuild the engine; "
                      "cannot run here: no NVIDIA GPU (no CUDA driver found)")


def test_matching_gpu_and_version_is_ok():
    ok, reason = compatibility_verdict(BUILT.__dict__ | {"targets": ["sm_86"]}, gpus=["sm86"], installed="1.7.1.200")
    assert ok, reason
    assert reason == "ok: TensorRT-RTX 1.7.1.200, GPU sm86 within targets sm86"


def test_flavour_not_installed():
    info = EngineBuildInfo("tensorrt", "10.13.0", ())
    pytest.importorskip("tensorrt_rtx")
    try:
        import tensorrt  # noqa: F401
        pytest.skip("full TensorRT is installed")
    except ImportError:
        pass
    ok, reason = compatibility_verdict(info, gpus=["sm90"])
    assert not ok and reason.startswith("built with TensorRT 10.13.0, which is not installed")


def test_header_cross_check(tmp_path):
    engine = tmp_path / "rank0.engine"
    # the first bytes of a TensorRT-RTX 1.7.1 engine built for sm86 (bit 2 of the target mask)
    header = bytearray(64)
    header[0:4] = header[0x1C:0x20] = b"vtrt"
    header[0x18:0x1B] = bytes([1, 7, 1])
    header[0x20] = 0b100
    engine.write_bytes(bytes(header))
    assert compatibility.read_rtx_header(engine) == compatibility.EngineHeader("1.7.1", ("sm86",))
    ok, reason = compatibility_verdict(EngineBuildInfo("tensorrt_rtx", "1.7.0.9", ()), engine_path=engine,
                                       gpus=["sm89"], installed="1.7.0.9")
    assert not ok
    assert "was written by TensorRT-RTX 1.7.1, not 1.7.0.9 as the manifest says" in reason
    assert "compute capability 8.9 not among targets sm86" in reason  # targets from the header
    assert compatibility.read_rtx_header(b"not an engine" * 8) is None


def test_this_host_verdict_for_a_real_engine_without_gpu(tmp_path):
    pytest.importorskip("tensorrt_rtx")
    if compatibility.gpu_compute_capabilities():
        pytest.skip("this host has a GPU")
    ok, reason = compatibility_verdict({"tensorrt": {"flavour": "tensorrt_rtx", "trt_version": _rtx_version(),
                                                     "targets": ["sm86"]}})
    assert not ok and reason == "cannot run here: no NVIDIA GPU (no CUDA driver found)"


def _rtx_version() -> str:
    import tensorrt_rtx

    return tensorrt_rtx.__version__


def test_inspector_json_and_builder_log_parse_the_same_fields():
    text = json.dumps({"Layers": [
        {"Name": "_gemv_mha_v1_myl0_4", "LayerType": "kgen", "TacticName": "_gemv_mha_v1_0xabc",
         "Metadata": "[ONNX Layer: 0.attention]"},
        "plain_name_only",
    ]})
    layers = engine_layers.layers_from_inspector_json(text)
    assert layers[0] == engine_layers.EngineLayer("_gemv_mha_v1_myl0_4", "kgen", "_gemv_mha_v1_0xabc", ("0.attention",))
    assert layers[1].name == "plain_name_only"
    log = ("Layers:\nName: _gemv_mha_v1_myl0_4, LayerType: kgen, Inputs: [ { Name: k, Dimensions: [-1,2] }], "
           "Constants: [], Outputs: [], TacticName: _gemv_mha_v1_0xabc, StreamId: 0, "
           "Metadata: [ONNX Layer: 0.attention]")
    assert engine_layers.layers_from_builder_log([log]) == layers[:1]
    assert engine_layers.count_layer_types(layers[:1]) == {"kgen": 1}
