"""TensorRT-RTX builds every segment of a tp rank (real builds, no GPU needed): the split graphs are valid
TensorRT networks, not only onnxruntime ones."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")

from converters.convert import convert  # noqa: E402
from engine_builder.build.parallel_build import build_parallel  # noqa: E402
from engine_builder.formats.build_config import BuildConfig, Limits  # noqa: E402
from engine_builder.formats.manifest import EngineManifest  # noqa: E402


def test_one_tp_rank_builds_every_segment_with_tensorrt(tiny_model_dir, tmp_path):
    convert(tiny_model_dir("llama"), tmp_path / "ckpt", dtype="float16", tp=2)
    config = BuildConfig(targets=("tensorrt", "onnxruntime"), dtype="float16", compute_capabilities=("sm86",),
                         limits=Limits(max_batch=2, max_input_len=16, max_seq_len=32))
    result = build_parallel(tmp_path / "ckpt", tmp_path / "engine", config, ranks=(1,))
    names = ["embed", "layers.0.attn", "layers.0.mlp", "layers.1.attn", "layers.1.mlp", "head"]
    segments = EngineManifest.load(tmp_path / "engine").tensorrt["segments"]
    assert sorted(segments) == sorted(f"rank1.{n}.engine" for n in names)
    for name, report in segments.items():
        assert (tmp_path / "engine" / name).stat().st_size == report["engine_bytes"] > 0
        assert report["engine_layer_types"], name
    assert result.engine_bytes == sum(r["engine_bytes"] for r in segments.values())
    # the keys a single-process build records, summed over the segments (what `trtbuild inspect` prints)
    report = EngineManifest.load(tmp_path / "engine").tensorrt
    assert report["num_profiles"] == 2 and report["network_layer_types"]["MATRIX_MULTIPLY"] > 0
    assert not list((tmp_path / "engine").glob("rank0.*"))  # only the rank asked for
