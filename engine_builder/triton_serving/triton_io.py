"""The Triton model's inputs and outputs: one table read by the exported config.pbtxt and the pytriton binding.

The names follow TensorRT-LLM's Triton ensemble (text_input, max_tokens, temperature, random_seed, stream,
text_output, output_ids), so clients written for it work unchanged. Scalars are shape [1] in a model without
a batch dimension (max_batch_size 0): requests are batched in flight by the executor, not by Triton.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from engine_builder.util.errors import InputError

TritonType = Literal["BYTES", "INT32", "UINT64", "FP32", "BOOL"]


@dataclass(frozen=True)
class TritonTensor:
    name: str
    data_type: TritonType  # Triton's wire type name (tritonclient's InferInput datatype)
    dims: tuple[int, ...]  # -1 = variable
    optional: bool = False
    doc: str = ""


INPUTS: tuple[TritonTensor, ...] = (
    TritonTensor("text_input", "BYTES", (1,), doc="the prompt, UTF-8"),
    TritonTensor("max_tokens", "INT32", (1,), doc="most new tokens"),
    TritonTensor("temperature", "FP32", (1,), optional=True, doc="sampling temperature; absent or 0 = greedy"),
    TritonTensor("random_seed", "UINT64", (1,), optional=True, doc="per-request seed for sampling"),
    TritonTensor("stream", "BOOL", (1,), optional=True,
                 doc="true: one response per token; absent/false: one response with the whole text (HTTP infer)"),
)

OUTPUTS: tuple[TritonTensor, ...] = (
    TritonTensor("text_output", "BYTES", (1,), doc="new text, UTF-8 (a delta when streaming)"),
    TritonTensor("output_ids", "INT32", (-1,), doc="the token ids this response carries"),
)

# the python-backend model's parameter naming the engine dir (config.pbtxt `parameters`)
ENGINE_DIR_PARAMETER = "engine_dir"
# Triton's python backend runs the model in the Python environment this parameter names (a dir or a
# conda-pack tarball); absent: the environment tritonserver was started in
EXECUTION_ENV_PARAMETER = "EXECUTION_ENV_PATH"

_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_model_name(name: str) -> str:
    """NAME as a Triton model name (a directory of the repository, a URL path segment), or an InputError."""
    if not _MODEL_NAME.fullmatch(name):
        raise InputError(f"{name!r} is not a usable Triton model name; pass --model-name with letters, digits, "
                         "'_', '-' or '.'")
    return name
