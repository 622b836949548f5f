"""The model Triton's python backend runs for a repository of `trtbuild export-triton` (REPO/NAME/1/model.py
imports TritonPythonModel from here). Decoupled: execute() hands each request to the executor and returns at
once; a thread per request sends its responses through the request's response sender, then the final flag.

`triton_python_backend_utils` exists only inside Triton's stub process, so it is imported there.
"""

from __future__ import annotations

import json
import threading

from engine_builder.executor.executor import Executor
from engine_builder.runner.llm import LLM
from engine_builder.triton_serving.triton_io import ENGINE_DIR_PARAMETER, INPUTS
from engine_builder.triton_serving.triton_requests import generate_responses, parse_request
from engine_builder.util.errors import TrtbuildError


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        engine_dir = config["parameters"][ENGINE_DIR_PARAMETER]["string_value"]
        self.llm = LLM(engine_dir)
        self.executor = Executor(self.llm)

    def execute(self, requests: list) -> None:
        import triton_python_backend_utils as pb_utils

        for request in requests:
            inputs = {}
            for spec in INPUTS:
                tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
                if tensor is not None:
                    inputs[spec.name] = tensor.as_numpy()
            threading.Thread(target=self._respond, args=(pb_utils, request.get_response_sender(), inputs),
                             daemon=True).start()
        return None

    def _respond(self, pb_utils, sender, inputs: dict) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            for outputs in generate_responses(self.executor, self.llm.encode, parse_request(inputs)):
                sender.send(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(name, value) for name, value in outputs.items()]))
        except TrtbuildError as exc:  # the client's request (bad input, over a limit): its message, no traceback
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=final)
            return
        except Exception as exc:  # noqa: BLE001 - whatever failed, the client must get an answer, not a hang
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"generation failed: {exc}")),
                        flags=final)
            return
        sender.send(flags=final)

    def finalize(self) -> None:
        self.executor.shutdown(drain=False)
