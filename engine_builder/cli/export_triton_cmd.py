"""`trtbuild export-triton`: a Triton model repository for an engine dir, a thin layer over
engine_builder.triton_serving.triton_repo.export_triton (same keywords). Bad input is one line and exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def export_triton(
    engine_dir: Annotated[Path, typer.Argument(help="Engine dir from `trtbuild build`.")],
    repo: Annotated[Path, typer.Argument(help="Model repository to write (new or empty dir).")],
    model_name: Annotated[str | None, typer.Option(help="The model's name in Triton. Default: the engine dir's "
                                                        "name.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace REPO when it already holds a model "
                                                        "repository.")] = False,
    python_env: Annotated[Path | None, typer.Option(help="Python environment (venv or unpacked conda env with "
                                                         "trtbuild installed) for Triton's python backend: written "
                                                         "as EXECUTION_ENV_PATH. Default: tritonserver's own.")]
    = None,
) -> None:
    """Write a Triton Inference Server model repository serving ENGINE_DIR: REPO/NAME/config.pbtxt (python
    backend, decoupled streaming) and REPO/NAME/1/model.py. The engine is referenced, not copied.

    \b
    Example:
      trtbuild export-triton engine triton-repo
      tritonserver --model-repository triton-repo
    """
    from engine_builder.triton_serving.triton_repo import export_triton as export

    done = export(engine_dir, repo, model_name=model_name, force=force, python_env=python_env)
    print(done.config_path)
