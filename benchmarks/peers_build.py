"""What benchmarks/peers.py runs, made once per work dir (each step skipped when its output is there).

All start from the bundled SmolLM2-135M-Instruct Q4_1 GGUF:
  ours      `convert` (benchmarks/smollm2_quant.py's variants) + `build` of the onnxruntime float32 twin
  genai     onnxruntime-genai's own model builder (`python -m onnxruntime_genai.models.builder`) on the
            GGUF dequantized to a Hugging Face folder (transformers' GGUF loader): fp32, and int4 with
            block 32 and accuracy level 4 (its CPU default; its int4 puts lm_head and the tied
            embedding at int4 too)
  llama.cpp the GGUF file itself
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))  # after the repo root: benchmarks/passes.py would shadow passes/

from smollm2_quant import checkpoint  # noqa: E402


@dataclass(frozen=True)
class System:
    label: str  # the table's row
    kind: str  # peers_worker.py's KIND
    variant: str  # ours: smollm2_quant variant; genai: fp32 / int4; else ""
    quantized: bool  # scored for fidelity against our fp32 twin


SYSTEMS = {
    "transformers": System("HF transformers fp32", "transformers", "", False),
    "ours-fp32": System("ours fp32 twin", "ours", "fp32", False),
    "genai-fp32": System("onnxruntime-genai fp32", "genai", "fp32", False),
    "ours-int4": System("ours int4_awq g32 (lm_head int8, default)", "ours", "int4_awq_g32_lm8", True),
    "ours-int4-same": System("ours int4_awq g32 --lm-head same", "ours", "int4_awq_g32_lm4", True),
    # int4_wo: the same without AWQ's calibration (minutes faster to convert on a small machine)
    "ours-int4wo": System("ours int4_wo g32 (lm_head int8, default)", "ours", "int4_wo_g32_lm8", True),
    "ours-int4wo-same": System("ours int4_wo g32 --lm-head same", "ours", "int4_wo_g32_lm4", True),
    "genai-int4": System("onnxruntime-genai int4 (block 32, acc. level 4)", "genai", "int4", True),
    "llama.cpp": System("llama.cpp Q4_1 file (llama-cpp-python)", "llama.cpp", "", True),
    "ours-gguf": System("ours --quant gguf (the file's Q4_1 blocks)", "ours", "gguf", True),
    # llama.cpp's own arithmetic: it multiplies Q4_1 blocks by activations quantized to Q8_1 and its Q8_0 head by
    # Q8_0 activations; here the same blocks at onnxruntime's int8 activations (`build --twin-accuracy draft`)
    "ours-gguf-int8act": System("ours --quant gguf --lm-head int8, int8 activations", "ours", "gguf_lm8", True),
    # exact again: the Q8_0 head in its own blocks at float activations, as two 4-bit MatMulNBits
    # (passes/lower_ort_matmulnbits.py), where `ours-gguf` reads it dequantized to float32 (113 of its 193 MB a token)
    "ours-gguf-exact-head": System("ours --quant gguf --lm-head int8, --twin-accuracy exact", "ours",
                                   "gguf_lm8_exact", True),
}
TWIN_ACCURACY = {"gguf_lm8": "draft", "gguf_lm8_exact": "exact"}  # variant -> `build --twin-accuracy` (else auto)
DEFAULT_SYSTEMS = [s for s in SYSTEMS if s not in ("transformers", "ours-int4wo", "ours-int4wo-same",
                                                  "ours-gguf-int8act", "ours-gguf-exact-head")]


def hf_dequantized(work: Path) -> Path:
    """The GGUF dequantized to a float32 Hugging Face folder (what onnxruntime-genai's builder reads)."""
    out = work / "hf-dequantized"
    if (out / "config.json").exists():
        return out
    import torch
    import transformers

    from engine_builder.util.bundled import smollm2_gguf

    gguf = smollm2_gguf()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # a GGUF-loaded model refuses save_pretrained ("quantized with gguf"): copy its weights into a plain one
    plain = transformers.AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    if hasattr(plain.config, "quantization_config"):
        del plain.config.quantization_config
    plain.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return out


def genai_model(work: Path, precision: str) -> Path:
    out = work / f"genai-{precision}"
    if (out / "genai_config.json").exists():
        return out
    hf = hf_dequantized(work)
    extra = ["--extra_options", "block_size=32", "accuracy_level=4"] if precision == "int4" else []
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out), "-p", precision,
           "-e", "cpu", "-c", str(work / "genai-cache"), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"onnxruntime-genai's builder failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    return out


def our_engine(work: Path, variant: str, max_seq: int, max_input: int, max_batch: int) -> Path:
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import DEFAULT_PASSES, BuildConfig, Limits, PassLists
    from engine_builder.formats.twin_accuracy import with_twin_accuracy

    out = work / f"engine-{variant}-b{max_batch}-i{max_input}-s{max_seq}"
    if not (out / "manifest.json").exists():
        limits = Limits(max_batch=max_batch, max_input_len=max_input, max_seq_len=max_seq)
        passes = PassLists(onnxruntime=with_twin_accuracy(DEFAULT_PASSES["onnxruntime"], TWIN_ACCURACY[variant])) \
            if variant in TWIN_ACCURACY else PassLists()
        build(checkpoint(work, variant), out, BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits,
                                                          passes=passes), force=out.exists())
    return out


def artifact(work: Path, name: str, max_seq: int, max_input: int, max_batch: int) -> Path:
    """The path peers_worker.py opens for system NAME, made if missing."""
    from engine_builder.util.bundled import smollm2_gguf

    s = SYSTEMS[name]
    if s.kind == "ours":
        return our_engine(work, s.variant, max_seq, max_input, max_batch)
    if s.kind == "genai":
        return genai_model(work, s.variant)
    if s.kind == "transformers":
        return hf_dequantized(work)
    return smollm2_gguf()


def weight_bytes(path: Path) -> int:
    """Bytes of the weights a system reads per decoded token: its ONNX graph's initializers, each once (a
    tied embedding shared with lm_head counts once), except those only gathered from (an embedding table
    read one row per token); the GGUF file's size; or transformers' safetensors."""
    if path.suffix == ".gguf":
        return path.stat().st_size
    if not (path / "model.onnx").exists():  # transformers: its safetensors
        return sum(p.stat().st_size for p in path.glob("*.safetensors"))
    import onnx

    model = onnx.load(str(path / "model.onnx"), load_external_data=False)
    consumers: dict[str, set[str]] = {}

    def walk(graph) -> None:
        for node in graph.node:
            for i, name in enumerate(node.input):
                gathered = node.op_type in ("Gather", "GatherBlockQuantized") and i == 0
                consumers.setdefault(name, set()).add("gather" if gathered else node.op_type)
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    walk(sub)

    walk(model.graph)
    total = 0
    for t in model.graph.initializer:
        if consumers.get(t.name, set()) <= {"gather"}:
            continue  # an embedding table (or unused): one row per token
        external = {e.key: e.value for e in t.external_data}
        total += int(external["length"]) if "length" in external else len(t.raw_data)
    return total
