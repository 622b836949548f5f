"""Bad input to `trtbuild convert`: exit code 2, one line saying what to do, OUT untouched."""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import cli_process
import pytest
import torch
import transformers
from cli_process import trtbuild
from safetensors.torch import save_file


def run_convert(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return trtbuild("convert", *args, timeout=timeout)


def assert_user_error(proc: subprocess.CompletedProcess[str], out: Path, *needles: str) -> None:
    """The one-line error, and nothing left behind: no OUT, no temp dir beside it."""
    cli_process.assert_user_error(proc, *needles)
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temp dir left behind"


@pytest.fixture
def hf_copy(tiny_model_dir, tmp_path) -> Path:
    """A private copy of the tiny llama dir that a test may damage."""
    src = tiny_model_dir("llama")
    dst = tmp_path / "hf"
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_missing_config(hf_copy, tmp_path):
    (hf_copy / "config.json").unlink()
    assert_user_error(run_convert(hf_copy, tmp_path / "out"), tmp_path / "out", "no config.json")


def test_missing_source(tmp_path):
    assert_user_error(run_convert(tmp_path / "nope", tmp_path / "out"), tmp_path / "out", "does not exist")


def test_unknown_model_type_lists_supported(hf_copy, tmp_path):
    config = json.loads((hf_copy / "config.json").read_text())
    (hf_copy / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    proc = run_convert(hf_copy, tmp_path / "out")
    assert_user_error(proc, tmp_path / "out", "'mamba'", "supported:", "gemma2", "gemma3", "llama", "mistral",
                      "phi3", "qwen2", "qwen3")


def test_truncated_safetensors(hf_copy, tmp_path):
    weights = hf_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    assert_user_error(run_convert(hf_copy, tmp_path / "out"), tmp_path / "out", "truncated or corrupt")


def test_corrupt_safetensors_header(hf_copy, tmp_path):
    weights = hf_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:20] = b"not json at all"[:12]
    weights.write_bytes(bytes(data))
    assert_user_error(run_convert(hf_copy, tmp_path / "out"), tmp_path / "out", "not a valid safetensors")


def test_shape_disagrees_with_config(hf_copy, tmp_path):
    config = json.loads((hf_copy / "config.json").read_text())
    (hf_copy / "config.json").write_text(json.dumps({**config, "intermediate_size": 100}))
    assert_user_error(run_convert(hf_copy, tmp_path / "out"), tmp_path / "out", "shape", "disagree")


def test_pickle_only_checkpoint_is_refused_unopened(hf_copy, tmp_path):
    (hf_copy / "model.safetensors").unlink()
    marker = tmp_path / "unpickled"
    # if anything unpickled this file, it would create `marker`
    payload = pickle.dumps(_Trap(str(marker)))
    (hf_copy / "pytorch_model.bin").write_bytes(payload)
    proc = run_convert(hf_copy, tmp_path / "out")
    assert_user_error(proc, tmp_path / "out", "pickle", "safetensors")
    assert not marker.exists()


class _Trap:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_unreadable_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(os.urandom(4096))
    assert_user_error(run_convert(bad, tmp_path / "out"), tmp_path / "out", "GGUF")


def test_out_exists_needs_force(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run_convert(tiny_model_dir("llama"), out)
    assert proc.returncode == 2 and "--force" in proc.stderr and "Traceback" not in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"
    # --force replaces only a previous checkpoint (issue 15): a dir of other files is refused and kept
    cli_process.assert_user_error(run_convert(tiny_model_dir("llama"), out, "--force"), "not a previous output")
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()  # an empty dir is nothing to lose
    assert run_convert(tiny_model_dir("llama"), out, "--force").returncode == 0
    (out / "keep.txt").write_text("inside a checkpoint")
    proc = run_convert(tiny_model_dir("llama"), out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert not (out / "keep.txt").exists() and (out / "rank0.safetensors").is_file()


def test_checkpoint_of_schema_1_says_to_reconvert(tiny_model_dir, tmp_path):
    """A checkpoint dir from before the typed block spec (schema 1: flat flags in "model") is refused by
    `trtbuild build` in one line that names its schema and the command that rewrites it."""
    ckpt = tmp_path / "ckpt"
    proc = run_convert(tiny_model_dir("llama"), ckpt)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((ckpt / "config.json").read_text())
    block = config["model"].pop("block")
    config["model"].update(rms_norm_eps=block["norm"]["eps"], norm_offset=block["norm"]["weight_offset"],
                           activation=block["mlp"]["activation"], mlp_bias=block["mlp"]["bias"],
                           **{k: v for k, v in block["attention"].items() if k not in ("scale", "logit_softcap")},
                           attention_scale=None, attn_logit_softcap=None, **block["residual"])
    (ckpt / "config.json").write_text(json.dumps({**config, "schema_version": 1}))
    out = tmp_path / "engine"
    proc = trtbuild("build", ckpt, out, "--target", "onnxruntime", timeout=120)
    cli_process.assert_user_error(proc, "schema 1", "trtbuild convert")
    assert not out.exists()


def test_bad_dtype_flag(tiny_model_dir, tmp_path):
    assert_user_error(run_convert(tiny_model_dir("llama"), tmp_path / "out", "--dtype", "int3"),
                      tmp_path / "out", "--dtype")


def test_debug_shows_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "engine_builder.cli", "--debug", "convert",
                           str(tmp_path / "nope"), str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_dry_run_writes_nothing(tiny_model_dir, tmp_path):
    proc = run_convert(tiny_model_dir("qwen2"), tmp_path / "out", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    table = json.loads(proc.stdout)
    qkv = next(r for r in table["tensors"] if r["canonical"] == "layers.0.attn.qkv.bias")
    assert qkv["sources"] == [f"model.layers.0.self_attn.{p}_proj.bias" for p in "qkv"]
    assert not (tmp_path / "out").exists()


def test_ctrl_c_during_write_leaves_nothing(tmp_path):
    """SIGINT once the temp dir exists: exit 2, no OUT, no temp dir."""
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in transformers.LlamaForCausalLM(config).state_dict().items()}
    (tmp_path / "hf").mkdir()
    config.save_pretrained(tmp_path / "hf")
    save_file({k: torch.zeros(s) for k, s in shapes.items()}, tmp_path / "hf" / "model.safetensors")
    out = tmp_path / "out"
    # float32 -> bfloat16 makes every tensor pass through a conversion: slow enough to interrupt
    proc = subprocess.Popen([sys.executable, "-m", "engine_builder.cli", "convert", str(tmp_path / "hf"),
                             str(out), "--dtype", "bfloat16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not any((p / "rank0.safetensors").exists() for p in tmp_path.glob(".out.tmp-*")):
        assert proc.poll() is None and time.monotonic() < deadline, "convert ended before it could be interrupted"
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert not out.exists()
    assert not list(tmp_path.glob(".out.*"))


# Issue 36 LOW 8: each file convert reads from a checkpoint dir is checked at convert time (not at run), with a
# size bound before it is read


def test_deeply_nested_config_json(hf_copy, tmp_path):
    (hf_copy / "config.json").write_text("[" * 100_000 + "]" * 100_000)  # RecursionError in json.loads
    assert_user_error(run_convert(hf_copy, tmp_path / "out"), tmp_path / "out", "config.json",
                      "nested too deeply", "re-download")


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "tokenizer.json"])
def test_oversized_file_refused_before_reading(hf_copy, tmp_path, name):
    """A sparse file of zeros past the bound: refused by its size, not as the invalid JSON it also is."""
    with open(hf_copy / name, "wb") as f:
        f.truncate((64 << 20) + 1)
    assert_user_error(run_convert(hf_copy, tmp_path / "out", "--dry-run"), tmp_path / "out", name, "MiB",
                      "re-download")


def _rewrite_safetensors_header(path: Path, edit) -> None:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    edit(header, sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"]))
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def _reverse_first(header, names):
    header[names[0]]["data_offsets"].reverse()


def _overlap_second(header, names):  # the second tensor starts 4 bytes inside the first, same size
    header[names[1]]["data_offsets"] = [o - 4 for o in header[names[1]]["data_offsets"]]


def _shape_disagrees(header, names):  # an [a, b] tensor read as [a, b - 1] leaves bytes that belong to no tensor
    header[names[0]]["shape"][-1] -= 1


@pytest.mark.parametrize(("edit", "needle"), [(_reverse_first, "data_offsets"), (_overlap_second, "overlaps"),
                                              (_shape_disagrees, "needs")])
def test_safetensors_offsets_must_tile_the_data(hf_copy, tmp_path, edit, needle):
    """Reversed offsets failed mid-write with a traceback; overlapping ones passed convert and copied the bytes."""
    _rewrite_safetensors_header(hf_copy / "model.safetensors", edit)
    assert_user_error(run_convert(hf_copy, tmp_path / "out"), tmp_path / "out", "model.safetensors", needle,
                      "re-download or re-save")


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("tokenizer.json", '{"version": "1.0", "model": {"type": "Nope"}}', "tokenizers library can load"),
    ("tokenizer.json", "[" * 100_000, "tokenizers library can load"),
    ("tokenizer_config.json", '["not", "an", "object"]', "not a JSON object"),
    ("tokenizer_config.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("merges.txt", b"\xff\xfe junk", "not UTF-8"),
])
def test_junk_tokenizer_file_refused_at_convert(hf_copy, tmp_path, name, content, needle):
    """A junk tokenizer.json passed convert and build, and `run` failed with transformers' traceback."""
    path = hf_copy / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    from converters.convert import plan
    from engine_builder.util.errors import InputError

    with pytest.raises(InputError, match="re-download the tokenizer files") as refused:
        plan(hf_copy)
    assert str(path) in str(refused.value) and needle in str(refused.value)


def test_junk_tokenizer_json_exits_2_and_writes_nothing(hf_copy, tmp_path):
    (hf_copy / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    assert_user_error(run_convert(hf_copy, tmp_path / "out"), tmp_path / "out", "tokenizer.json",
                      "re-download the tokenizer files")


def test_real_tokenizer_files_pass_and_are_copied(hf_copy, tmp_path):
    from runner_engines import add_word_tokenizer

    add_word_tokenizer(hf_copy, 320)
    proc = run_convert(hf_copy, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (hf_copy / name).read_bytes()
