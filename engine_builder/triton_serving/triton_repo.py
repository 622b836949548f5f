"""`trtbuild export-triton`: a Triton model repository serving an engine dir with Triton's python backend.

    REPO/NAME/config.pbtxt   backend "python", decoupled, the inputs/outputs of triton_io.py, one CPU
                             instance, parameter engine_dir (absolute path; the engine is not copied)
    REPO/NAME/1/model.py     imports TritonPythonModel from engine_builder.triton_serving.python_backend_model

The config is written from Triton's own ModelConfig protobuf (tritonclient's model_config_pb2) in text format,
not by hand. Triton must run where trtbuild is importable (the python backend's environment, or the one named
by --python-env, written as EXECUTION_ENV_PATH).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine_builder.formats.manifest import EngineManifest
from engine_builder.triton_serving.triton_io import (
    ENGINE_DIR_PARAMETER,
    EXECUTION_ENV_PARAMETER,
    INPUTS,
    OUTPUTS,
    TritonTensor,
    check_model_name,
)
from engine_builder.util.atomic_dir import atomic_output_dir, check_apart
from engine_builder.util.errors import InputError

CONFIG_FILE = "config.pbtxt"
MODEL_VERSION = "1"
MODEL_FILE = "model.py"
_MODEL_PY = '''"""Triton python-backend model written by `trtbuild export-triton`: it serves the engine dir named by the
engine_dir parameter of ../config.pbtxt (decoupled: one response per token when the request sets stream)."""

from engine_builder.triton_serving.python_backend_model import TritonPythonModel  # noqa: F401
'''


@dataclass(frozen=True)
class TritonExport:
    repo: Path
    model_name: str
    config_path: Path  # REPO/NAME/config.pbtxt
    engine_dir: Path  # absolute, as written in the config


def _model_config_pb2():
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        raise InputError("tritonclient is not installed; install the triton extra: pip install "
                         "'trtbuild[triton]'") from None
    return model_config_pb2


def model_config(name: str, engine_dir: Path, python_env: Path | None = None):
    """The repository's ModelConfig message (tritonclient.grpc.model_config_pb2.ModelConfig)."""
    pb = _model_config_pb2()
    config = pb.ModelConfig(name=name, backend="python", max_batch_size=0)  # the executor batches in flight
    config.model_transaction_policy.decoupled = True

    def add(field, spec: TritonTensor) -> None:
        wire = "STRING" if spec.data_type == "BYTES" else spec.data_type  # config.pbtxt calls BYTES TYPE_STRING
        tensor = field.add(name=spec.name, data_type=pb.DataType.Value(f"TYPE_{wire}"))
        tensor.dims.extend(spec.dims)
        if spec.optional:
            tensor.optional = True

    for spec in INPUTS:
        add(config.input, spec)
    for spec in OUTPUTS:
        add(config.output, spec)
    # one instance: each is a process holding the engine; requests share it through the executor
    config.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=1)
    config.parameters[ENGINE_DIR_PARAMETER].string_value = str(engine_dir)
    if python_env is not None:
        config.parameters[EXECUTION_ENV_PARAMETER].string_value = str(python_env)
    return config


def config_text(config) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(config)


def _is_model_repository(repo: Path) -> bool:
    """Only a previous repository is replaced by --force: every entry a model dir with a config.pbtxt."""
    return all(entry.is_dir() and (entry / CONFIG_FILE).is_file() for entry in repo.iterdir())


def export_triton(engine_dir: Path, repo: Path, *, model_name: str | None = None, force: bool = False,
                  python_env: Path | None = None) -> TritonExport:
    engine_dir = Path(engine_dir).absolute()
    repo = Path(repo)
    EngineManifest.load(engine_dir)  # a missing or foreign dir fails here with the fix
    check_apart(repo, [engine_dir])
    name = check_model_name(model_name or engine_dir.name)
    if python_env is not None and not (Path(python_env) / "bin" / "activate").is_file():
        raise InputError(f"--python-env {python_env} is not a Python environment (no bin/activate); give a venv "
                         "or unpacked conda env where trtbuild is installed")
    replace = False
    if repo.exists():
        if not repo.is_dir():
            raise InputError(f"{repo} exists and is not a directory; remove it or choose another path")
        if any(repo.iterdir()):
            if not force:
                raise InputError(f"{repo} is not empty; pass --force to replace it or choose an empty or new dir")
            if not _is_model_repository(repo):
                raise InputError(f"{repo} holds files that are not Triton models (dirs with {CONFIG_FILE}); "
                                 "--force replaces only a model repository: remove it yourself or choose another path")
        replace = True  # an empty dir, or a previous repository with --force
    config = model_config(name, engine_dir, None if python_env is None else Path(python_env).absolute())
    with atomic_output_dir(repo, force=replace, inputs=[engine_dir]) as tmp:
        version_dir = tmp / name / MODEL_VERSION
        version_dir.mkdir(parents=True)
        (tmp / name / CONFIG_FILE).write_text(config_text(config))
        (version_dir / MODEL_FILE).write_text(_MODEL_PY)
    return TritonExport(repo.absolute(), name, repo.absolute() / name / CONFIG_FILE, engine_dir)
