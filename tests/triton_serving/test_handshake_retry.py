"""The handshake retry that serve-triton gives pytriton's stubs (handshake_retry.py), on real unix sockets: the
proxy files pytriton sends with a model under serve-triton's wrapper hold it, and their
get_config_from_handshake_server waits out the bind-before-listen window that the original fails on."""

from __future__ import annotations

import dataclasses
import importlib.util
import socket
import threading
import time

import pytest
from pytriton.model_config import ModelConfig, Tensor
from pytriton.models.model import Model, TritonContext
from pytriton.utils.workspace import Workspace

from engine_builder.triton_serving.handshake_retry import MARKER, with_retry
from engine_builder.triton_serving.pytriton_binding import _stub_runs_in

CONFIG = {"data_socket": "/nowhere", "authkey": "a2V5"}


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def repository(tmp_path):
    """The proxy files pytriton sends with a model while serve-triton's wrapper is on, and after it, each set
    written out as the stub gets it: {"patched": dir, "plain": dir}."""
    tensor = Tensor(name="x", dtype=bytes, shape=(1,))
    model = Model(model_name="m", model_version=1, inference_fn=lambda requests: requests, inputs=[tensor],
                  outputs=[dataclasses.replace(tensor, name="y")],
                  config=ModelConfig(batching=False), workspace=Workspace(tmp_path / "workspace"),
                  triton_context=TritonContext(), strict=False)
    with _stub_runs_in(tmp_path / "env"):
        sent = {"patched": model.get_proxy_model_files()}
    sent["plain"] = model.get_proxy_model_files()  # the wrapper is gone after the block
    dirs = {}
    for kind, files in sent.items():
        dirs[kind] = tmp_path / kind
        for key, source in files.items():
            (dirs[kind] / key.removeprefix("file:")).parent.mkdir(parents=True, exist_ok=True)
            (dirs[kind] / key.removeprefix("file:")).write_bytes(source)
    return dirs["patched"] / "1", dirs["plain"] / "1"


def _bound_not_listening(path):
    """Instance 0's socket between its bind and its listen: the file exists, a connect is refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def test_the_wrapper_appends_the_retry_once(repository):
    patched, plain = repository
    assert (patched / "communication.py").read_text().count(MARKER) == 1
    assert MARKER not in (plain / "communication.py").read_text()
    again = with_retry({"file:1/communication.py": (patched / "communication.py").read_bytes()})
    assert again["file:1/communication.py"].decode().count(MARKER) == 1


def test_the_original_handshake_fails_in_the_window_and_the_retry_waits_it_out(repository, tmp_path):
    patched_dir, plain_dir = repository
    plain = _load(plain_dir / "communication.py", "plain_communication")
    patched = _load(patched_dir / "communication.py", "patched_communication")
    path = tmp_path / "m-config.sock"

    sock = _bound_not_listening(path)
    with pytest.raises(ConnectionRefusedError):
        plain.get_config_from_handshake_server(path)

    server = plain.HandshakeServer(path, CONFIG)

    def listen_later():
        time.sleep(0.5)
        sock.close()
        path.unlink()
        server.start()

    later = threading.Thread(target=listen_later)
    later.start()
    start = time.monotonic()
    try:
        assert patched.get_config_from_handshake_server(path) == CONFIG
        assert time.monotonic() - start >= 0.5
    finally:
        later.join()
        server.close()


def test_the_retry_gives_up_after_its_patience(repository, tmp_path, monkeypatch):
    patched = _load(repository[0] / "communication.py", "patched_communication_2")
    monkeypatch.setattr(patched, "time", _FastClock(patched.time))
    sock = _bound_not_listening(tmp_path / "never.sock")
    try:
        with pytest.raises(ConnectionRefusedError):
            patched.get_config_from_handshake_server(tmp_path / "never.sock")
    finally:
        sock.close()


class _FastClock:
    """time with each sleep advancing monotonic() by a minute: the patience runs out on the second try."""

    def __init__(self, real):
        self._real, self._offset = real, 0.0

    def __getattr__(self, name):
        return getattr(self._real, name)

    def monotonic(self):
        return self._real.monotonic() + self._offset

    def sleep(self, seconds):
        self._offset += 60.0
