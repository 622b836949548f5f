"""`trtbuild export-triton`: the repository layout, a config.pbtxt that Triton's own ModelConfig protobuf
reads back as a decoupled python-backend model, and the refusals (one line, exit 2). Serving the repository
in real Triton is tests/triton_serving/test_triton_repository.py."""

from __future__ import annotations

from cli_process import assert_user_error, trtbuild
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2


def _read_config(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_export_writes_a_decoupled_python_backend_model(tiny_serve_engine, tmp_path):
    repo = tmp_path / "repo"
    r = trtbuild("export-triton", tiny_serve_engine, repo, "--model-name", "tiny", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(repo.absolute() / "tiny" / "config.pbtxt")
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == [
        "tiny/1/model.py", "tiny/config.pbtxt"]
    config = _read_config(repo / "tiny" / "config.pbtxt")
    assert config.name == "tiny" and config.backend == "python" and config.max_batch_size == 0
    assert config.model_transaction_policy.decoupled
    types = model_config_pb2.DataType.Name
    assert [(i.name, types(i.data_type), list(i.dims), i.optional) for i in config.input] == [
        ("text_input", "TYPE_STRING", [1], False), ("max_tokens", "TYPE_INT32", [1], False),
        ("temperature", "TYPE_FP32", [1], True), ("random_seed", "TYPE_UINT64", [1], True),
        ("stream", "TYPE_BOOL", [1], True)]
    assert [(o.name, types(o.data_type), list(o.dims)) for o in config.output] == [
        ("text_output", "TYPE_STRING", [1]), ("output_ids", "TYPE_INT32", [-1])]
    assert config.parameters["engine_dir"].string_value == str(tiny_serve_engine.absolute())
    assert "EXECUTION_ENV_PATH" not in config.parameters  # tritonserver's own environment unless asked
    assert "TritonPythonModel" in (repo / "tiny" / "1" / "model.py").read_text()


def test_export_refusals_and_force(tiny_serve_engine, tmp_path):
    assert_user_error(trtbuild("export-triton", tmp_path / "missing", tmp_path / "r1"), "does not exist",
                      "trtbuild build")
    assert_user_error(trtbuild("export-triton", tiny_serve_engine, tiny_serve_engine / "repo"), "is inside input")
    assert_user_error(trtbuild("export-triton", tiny_serve_engine, tiny_serve_engine), "is input")
    assert_user_error(trtbuild("export-triton", tiny_serve_engine, tmp_path, "--model-name", "a/b"),
                      "--model-name")
    assert not (tiny_serve_engine / "repo").exists()

    repo = tmp_path / "repo"
    assert trtbuild("export-triton", tiny_serve_engine, repo).returncode == 0
    assert_user_error(trtbuild("export-triton", tiny_serve_engine, repo), "is not empty", "--force")
    r = trtbuild("export-triton", tiny_serve_engine, repo, "--model-name", "again", "--force")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in repo.iterdir()) == ["again"]  # replaced, not merged

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert_user_error(trtbuild("export-triton", tiny_serve_engine, other, "--force"), "not Triton models")
    assert (other / "notes.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert trtbuild("export-triton", tiny_serve_engine, empty).returncode == 0  # an empty dir needs no --force
