"""The Python environment that Triton's python-backend stub runs in, and what tritonserver needs to start it.

Why a second environment: the stub in the nvidia-pytriton 0.7.0 wheel is compiled against numpy 1.x (the
wheel pins numpy<2). Under numpy 2 its BYTES tensors arrive garbled (measured: "unpack_from requires a buffer
of at least 33686022 bytes ... (actual buffer size is 6)" for the 2-byte prompt "hi"), while trtbuild needs
numpy 2. So the stub gets a venv of this interpreter holding only numpy<2, with a .pth line that appends
this environment's site-packages (zmq, pytriton, trtbuild) after it; Triton's python backend selects it per
model with the EXECUTION_ENV_PATH parameter. The stub itself ignores PYTHONPATH (isolated config).

    python -m engine_builder.triton_serving.stub_env      # creates it (`make install` runs this)
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from engine_builder.util import environment
from engine_builder.util.errors import InputError

ENV_VARIABLE = "TRTBUILD_TRITON_PYTHON_ENV"
NUMPY_REQUIREMENT = "numpy>=1.21,<2"
_PTH = "trtbuild-main-env.pth"


def default_env() -> Path:
    return Path(environment.read(ENV_VARIABLE) or Path(sys.prefix) / "triton-python-env")


def _site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _has_numpy_1(env: Path) -> bool:
    return any(_site_packages(env).glob("numpy-1.*.dist-info"))


def create(env: Path | None = None) -> Path:
    """Create (or complete) the stub's environment: a venv without pip, numpy<2 installed by pip --target."""
    env = Path(env or default_env())
    if not (env / "bin" / "activate").is_file():
        venv.EnvBuilder(with_pip=False, clear=False).create(env)
    target = _site_packages(env)
    if not _has_numpy_1(env):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-warn-conflicts", "--target",
                        str(target), NUMPY_REQUIREMENT], check=True)
    # after its own site-packages: numpy 1.x first, everything else from this environment
    (target / _PTH).write_text("\n".join(site.getsitepackages()) + "\n")
    return env


def require(env: Path | None = None) -> Path:
    """The stub's environment, or an InputError naming the command that creates it."""
    env = Path(env or default_env())
    if not (env / "bin" / "activate").is_file() or not _has_numpy_1(env) or not (_site_packages(env) / _PTH).is_file():
        raise InputError(f"the Python environment for Triton's python backend is missing at {env}; create it with "
                         f"`{sys.executable} -m engine_builder.triton_serving.stub_env` (or set {ENV_VARIABLE})")
    return env


def server_environment() -> dict[str, str]:
    """Variables tritonserver must inherit: the stub links libpython3.X.so.1.0 by name, and without this
    interpreter's LIBDIR first it loads the system's (Debian's 3.11.2 here) against this interpreter's stdlib
    (pyenv 3.11.7): "'_thread.RLock' object has no attribute '_recursion_count'" at model load."""
    libdir = sysconfig.get_config_var("LIBDIR")
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if not libdir or libdir in current.split(":"):
        return {}
    return {"LD_LIBRARY_PATH": f"{libdir}:{current}" if current else libdir}


if __name__ == "__main__":
    print(create())
