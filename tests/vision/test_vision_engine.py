"""The vision engine: a vision-language build for target tensorrt also builds the vision tower + projector into a
TensorRT-RTX engine (vision.trt.onnx -> vision.engine, no GPU needed), one profile over images per call from 1 to
limits.max_images, beside the decoder's rank0.engine. A tiny random LLaVA (tiny_llava.py) built through the CLI
with recipes/llava-fp16.yaml as shipped; the manifest records both engines and their sha256, inspect shows both.
Gemma 3's and Idefics3's towers and projectors build theirs too."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest
from cli_process import assert_user_error, trtbuild
from tiny_gemma3 import IMAGE_SIZE, tiny_gemma3
from tiny_idefics3 import IMAGE_SIZE as IDEFICS3_TILE
from tiny_idefics3 import tiny_idefics3
from tiny_llava import tiny_llava

from converters.convert import convert
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import BuildConfig, Limits, load_recipe
from engine_builder.formats.manifest import ENGINE_FILE, EngineManifest
from engine_builder.formats.vision_spec import PIXEL_VALUES, VISION_ENGINE, VISION_MODEL, VISION_TRT_MODEL
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.engine_integrity import verify_engine_dir
from engine_builder.trt.compatibility import gpu_compute_capabilities
from engine_builder.util.errors import InputError
from engine_builder.util.file_hash import sha256_file

pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")

RECIPE = Path(__file__).parents[2] / "recipes" / "llava-fp16.yaml"
SHAPE = (3, 32, 32)  # the tiny CLIP tower's pixel_values per image: channels, height, width


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> tuple[Path, Path]:
    """The checkpoint, and the engine dir `trtbuild build --recipe recipes/llava-fp16.yaml` made of it."""
    root = tmp_path_factory.mktemp("vision-engine")
    convert(tiny_llava(root / "hf"), root / "ckpt", dtype="float32")
    proc = trtbuild("build", root / "ckpt", root / "engine", "--recipe", RECIPE, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["vision_engine"]["images"] == [1, 1, _max_images()]
    return root / "ckpt", root / "engine"


def _max_images() -> int:
    return load_recipe(RECIPE).build.limits.max_images


def test_the_recipe_builds_the_vision_engine_beside_the_decoders(llava):
    """Both engines and both vision graphs are in the dir, each with its sha256 among the manifest's files (what
    `run` and `verify` check); the vision graph parsed to native layers, in the recipe's dtype."""
    _, engine = llava
    m = EngineManifest.load(engine)
    assert m.targets == ("onnxruntime", "tensorrt") and _max_images() == 4
    v = m.vision_engine
    assert v is not None and (v.engine, v.graph, v.dtype) == (VISION_ENGINE, VISION_TRT_MODEL, "float16")
    assert v.images == (1, 1, 4) and v.engine_bytes == (engine / VISION_ENGINE).stat().st_size > 0
    # feature layer -2 of a 2-layer tower: one layer computed; the patch convolution, pre-norm + the layer's 2 norms
    layers = v.network_layer_types
    assert (layers["CONVOLUTION"], layers["NORMALIZATION"], layers["SOFTMAX"]) == (1, 3, 1)
    recorded = {d.name: d.sha256 for d in m.files}
    for name in (ENGINE_FILE, VISION_ENGINE, VISION_TRT_MODEL, VISION_MODEL):
        assert recorded[name] == sha256_file(engine / name), name
    assert m.graph_hashes["vision.tensorrt"] == recorded[VISION_TRT_MODEL]
    assert m.graph_hashes["vision"] == recorded[VISION_MODEL]
    assert all(verdict.ok for verdict in verify_engine_dir(engine))


def test_the_vision_engine_holds_its_images_per_call_profile(llava):
    """pixel_values' profile in the built engine is (1, 1, max_images) images of the tower's size.

    With a GPU, TensorRT-RTX's runtime says so (get_tensor_profile_shape). Without one (here) it cannot deserialize
    any engine (cudaError 35), so the plan's bytes are read: TensorRT-RTX 1.7.1 writes a profile's min, opt and max
    shapes in that order, each its rank then its dims as little-endian int64, 16 bytes of other fields between
    them (seen in engines built with max 4 and 7: only max's first dim moved)."""
    _, engine = llava
    want = [(n, *SHAPE) for n in (1, 1, _max_images())]
    data = (engine / VISION_ENGINE).read_bytes()
    if gpu_compute_capabilities():
        import tensorrt_rtx as trt

        from engine_builder.trt import compat

        runtime = trt.Runtime(compat.make_logger(trt))
        built = runtime.deserialize_cuda_engine(data)
        assert built.num_optimization_profiles == 1
        assert [tuple(s) for s in built.get_tensor_profile_shape(PIXEL_VALUES, 0)] == want
        return
    assert _profiles_in_plan(data, want) >= 1
    assert _profiles_in_plan(data, [(1, *SHAPE), (1, *SHAPE), (8, *SHAPE)]) == 0  # the default max is not built


def _profiles_in_plan(data: bytes, shapes: list[tuple[int, ...]]) -> int:
    """How often DATA holds SHAPES (min, opt, max) as TensorRT-RTX 1.7.1 serializes a profile: each shape its rank
    and dims in little-endian int64, a few fields between them."""
    encoded = [re.escape(struct.pack(f"<{1 + len(s)}q", len(s), *s)) for s in shapes]
    return len(re.findall(b".{0,32}".join(encoded), data, flags=re.DOTALL))


def test_gemma3s_siglip_tower_builds_its_engine_with_the_configured_max(tmp_path):
    """The same build for Gemma 3's SigLIP tower and pool-norm projector, limits.max_images given in code (2)."""
    convert(tiny_gemma3(tmp_path / "hf"), tmp_path / "ckpt", dtype="float32")
    out = tmp_path / "engine"
    build(tmp_path / "ckpt", out, BuildConfig(targets=("onnxruntime", "tensorrt"), dtype="bfloat16",
                                              compute_capabilities=("sm86",),
                                              limits=Limits(max_batch=1, max_input_len=32, max_seq_len=64,
                                                            max_images=2)))
    v = EngineManifest.load(out).vision_engine
    assert v is not None and v.images == (1, 1, 2) and v.dtype == "bfloat16"
    assert (v.network_layer_types["CONVOLUTION"], v.network_layer_types["POOLING"]) == (1, 1)
    shape = (3, IMAGE_SIZE, IMAGE_SIZE)
    assert _profiles_in_plan((out / VISION_ENGINE).read_bytes(), [(n, *shape) for n in (1, 1, 2)]) >= 1


def test_idefics3s_tower_and_pixel_shuffle_build_their_engine(tmp_path):
    """Idefics3's SigLIP tower and pixel-shuffle connector (tiny_idefics3.py): the same build, the profile over the
    tiles per call (an image is several: its tiles and the global image), at least one whole image's 2x2 + 1 even
    where limits.max_images is lower."""
    convert(tiny_idefics3(tmp_path / "hf"), tmp_path / "ckpt", dtype="float32")
    out = tmp_path / "engine"
    build(tmp_path / "ckpt", out, BuildConfig(targets=("onnxruntime", "tensorrt"), dtype="float16",
                                              compute_capabilities=("sm86",),
                                              limits=Limits(max_batch=1, max_input_len=64, max_seq_len=96,
                                                            max_images=2)))
    v = EngineManifest.load(out).vision_engine
    assert v is not None and v.images == (1, 1, 5) and v.dtype == "float16"
    assert (v.network_layer_types["CONVOLUTION"], v.network_layer_types["SOFTMAX"]) == (1, 2)
    shape = (3, IDEFICS3_TILE, IDEFICS3_TILE)
    assert _profiles_in_plan((out / VISION_ENGINE).read_bytes(), [(n, *shape) for n in (1, 1, 5)]) >= 1


def test_inspect_shows_the_vision_engine_beside_the_decoders(llava):
    _, engine = llava
    proc = trtbuild("inspect", engine, "--json")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["vision_engine"]["images"] == [1, 1, 4] and shown["vision_engine"]["engine"] == VISION_ENGINE
    assert shown["tensorrt"]["num_profiles"] == 3  # the decoder's: decode, verify, prefill
    assert "clip tower" in shown["vision"] and shown["limits"]["max_images"] == 4
    assert {VISION_ENGINE, VISION_TRT_MODEL, VISION_MODEL, ENGINE_FILE} <= set(shown["integrity"]["recorded"])
    table = trtbuild("inspect", engine)
    assert table.returncode == 0, table.stderr
    assert "vision.engine (float16" in table.stdout and "1..4 images per call" in table.stdout
    assert "max_images 4" in table.stdout


def test_a_changed_byte_in_the_vision_engine_is_refused(llava, tmp_path):
    """The manifest's sha256 covers vision.engine: loading for `run` and `trtbuild verify` refuse a changed byte."""
    _, built = llava
    engine = Path(shutil.copytree(built, tmp_path / "engine"))
    with open(engine / VISION_ENGINE, "r+b") as f:  # the last byte, in place: same size and inode
        f.seek(-1, 2)
        byte = f.read(1)[0]
        f.seek(-1, 2)
        f.write(bytes([byte ^ 0xFF]))
    with pytest.raises(InputError, match=VISION_ENGINE):
        EngineDir.load(engine)
    assert {v.name: v.status for v in verify_engine_dir(engine)}[VISION_ENGINE] == "modified"
    assert_user_error(trtbuild("verify", engine), "1 of", VISION_ENGINE)


def test_an_onnxruntime_build_has_no_vision_engine(llava, tmp_path):
    ckpt, _ = llava
    out = tmp_path / "engine"
    result = build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                          limits=Limits(max_batch=1, max_input_len=32, max_seq_len=64)))
    assert result.vision_engine is None and EngineManifest.load(out).vision_engine is None
    assert (out / VISION_MODEL).is_file() and not (out / VISION_ENGINE).exists()
    assert not (out / VISION_TRT_MODEL).exists()


def test_max_images_is_a_checked_limit(llava, tmp_path):
    ckpt, _ = llava
    proc = trtbuild("build", ckpt, tmp_path / "engine", "--recipe", RECIPE, "--set", "limits.max_images=0")
    assert_user_error(proc, "max_images must be a positive integer")
    assert not (tmp_path / "engine").exists()
