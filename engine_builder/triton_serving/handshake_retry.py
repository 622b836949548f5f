"""A retry for pytriton 0.7.0's handshake between the python-backend stubs of one model's instances.

Triton starts a model's instances in parallel. Instance 0's stub binds a unix socket and then listens on it
(asyncio.start_unix_server); every other instance polls for the socket file for 1 s, then connects once. On a
busy machine the connect can fall between the bind and the listen (ConnectionRefusedError: measured on the
2-core CI, where `trtbuild serve-triton` then failed to load the model), or instance 0 can take over 1 s to get
there (TimeoutError). The stubs run the copies of pytriton's proxy files that pytriton sends with each model's
load request, not this process's pytriton, so the retry is appended to the copy of communication.py: it rebinds
the module's name, which model.py imports only after the module has run.
"""

from __future__ import annotations

HANDSHAKE_PATIENCE_S = 60.0  # a stub loading beside others on 2 busy cores takes seconds, never a minute

MARKER = "# trtbuild: handshake retry"
_RETRY = f'''

{MARKER} (engine_builder/triton_serving/handshake_retry.py says why)
_pytriton_get_config_from_handshake_server = get_config_from_handshake_server


def get_config_from_handshake_server(socket_path, timeout_s=1.0):
    deadline = time.monotonic() + {HANDSHAKE_PATIENCE_S}
    while True:
        try:
            return _pytriton_get_config_from_handshake_server(socket_path, timeout_s)
        except (ConnectionRefusedError, TimeoutError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
'''


def with_retry(files: dict[str, bytes]) -> dict[str, bytes]:
    """pytriton's proxy files for a model (Model.get_proxy_model_files: "file:<version>/<name>" -> source) with the
    retry appended to communication.py."""
    return {key: source + _RETRY.encode() if key.endswith("/communication.py") and MARKER.encode() not in source
            else source for key, source in files.items()}
