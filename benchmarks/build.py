"""`trtbuild build` of SmolLM2-135M fp16 vs a plain TensorRT-RTX build of the same graph.

    .venv/bin/python benchmarks/build.py [--runs 3] [--convert-dtype auto|float16] [--json]

Converts the bundled GGUF once, then alternates `trtbuild build --recipe recipes/smollm2-135m-fp16.yaml`
with a minimal Builder / OnnxParser / build_serialized_network script (this file's --plain-trt
mode: no trtbuild code imported) fed the model.trt.onnx the first trtbuild run wrote, with the
same compute capabilities, optimization level, profiling verbosity and optimization profiles.
The difference is trtbuild's overhead: graph emission, passes, the ONNX twin, manifest.

Figures: build wall seconds (median), peak RSS of each build process (GNU time %M), trtbuild's
own peak_rss_bytes (above its baseline), and peak RSS / fp16 weight bytes (goal <= 1.5x).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from measure import RSS_SOURCE, Run, run_child

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "smollm2-135m-fp16.yaml"
TRTBUILD = Path(sys.executable).with_name("trtbuild")  # the venv's console script
_FLOAT_DTYPES = {"F32", "F16", "BF16"}  # what the checkpoint may hold; the engine holds each as fp16
RATIO_GOAL = 1.5


def fp16_weight_bytes(safetensors: Path) -> int:
    """Parameter count x 2 from the header alone: what the fp16 engine must hold, whatever the checkpoint dtype."""
    with open(safetensors, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return sum(2 * math.prod(meta["shape"]) for name, meta in header.items()
               if name != "__metadata__" and meta["dtype"] in _FLOAT_DTYPES)


# --- plain TensorRT-RTX build: runs in its own process, imports nothing from trtbuild -------

def _vm_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def plain_trt_build(spec: dict[str, Any]) -> dict[str, Any]:
    """What a user without trtbuild writes: parse the ONNX, set targets and profiles, build, write."""
    import tensorrt_rtx as trt

    Path("/proc/self/clear_refs").write_text("5")  # high-water mark from here, as trtbuild's PeakRss
    baseline_kib = _vm_kib("VmRSS")
    started = time.perf_counter()
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT-RTX networks are always strongly typed
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(spec["onnx"]):  # from the path: external data resolves beside it
        raise SystemExit("; ".join(parser.get_error(i).desc() for i in range(parser.num_errors)))
    config = builder.create_builder_config()
    config.num_compute_capabilities = len(spec["compute_capabilities"])
    for index, cc in enumerate(spec["compute_capabilities"]):
        config.set_compute_capability(getattr(trt.ComputeCapability, cc.upper()), index)
    config.builder_optimization_level = spec["opt_level"]
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # trtbuild sets it for its layer report
    for shapes in spec["profiles"]:
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise SystemExit("TensorRT-RTX failed to build the engine")
    Path(spec["engine"]).write_bytes(memoryview(serialized))
    return {"seconds": round(time.perf_counter() - started, 3), "engine_bytes": serialized.nbytes,
            "peak_rss_bytes": (_vm_kib("VmHWM") - baseline_kib) * 1024}


# --- the benchmark ---------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="timed builds of each (medians reported)")
    ap.add_argument("--convert-dtype", default="auto", choices=["auto", "float16"],
                    help="checkpoint dtype: auto is float32 for the GGUF (the README path)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ap.add_argument("--plain-trt", metavar="SPEC_JSON", help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args()
    if args.plain_trt:
        print(json.dumps(plain_trt_build(json.loads(Path(args.plain_trt).read_text()))))
        return 0

    load_at_start = round(os.getloadavg()[0], 2)
    gguf = subprocess.run([sys.executable, "-m", "engine_builder.util.bundled"], check=True,
                          capture_output=True, text=True, cwd=ROOT).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="trtbuild-bench-build-") as tmp_name:
        tmp = Path(tmp_name)
        ckpt, plain_dir = tmp / "ckpt", tmp / "plain"
        convert = [str(TRTBUILD), "convert", gguf, str(ckpt), "--json"]
        run_child(convert + (["--dtype", args.convert_dtype] if args.convert_dtype != "auto" else []))
        ckpt_dtype = json.loads((ckpt / "config.json").read_text())["dtype"]
        weight_bytes = fp16_weight_bytes(ckpt / "rank0.safetensors")

        trt_runs: list[tuple[Run, dict[str, Any]]] = []
        plain_runs: list[tuple[Run, dict[str, Any]]] = []
        spec_path = tmp / "plain.json"
        for i in range(args.runs):  # alternate, so drift on a shared machine hits both alike
            out = tmp / f"engine{i}"
            r = run_child([str(TRTBUILD), "build", str(ckpt), str(out), "--recipe", str(RECIPE), "--json"])
            trt_runs.append((r, json.loads(r.stdout)))
            if i == 0:  # the plain build gets exactly the graph and settings trtbuild handed TensorRT
                manifest = json.loads((out / "config.json").read_text())
                plain_dir.mkdir()
                shutil.copyfile(out / "model.trt.onnx", plain_dir / "model.trt.onnx")
                os.link(out / "rank0.safetensors", plain_dir / "rank0.safetensors")
                spec_path.write_text(json.dumps({
                    "onnx": str(plain_dir / "model.trt.onnx"), "engine": str(plain_dir / "rank0.engine"),
                    "compute_capabilities": manifest["tensorrt"]["targets"],
                    "opt_level": manifest["build"]["opt_level"], "profiles": manifest["tensorrt"]["profiles"]}))
            shutil.rmtree(out)  # one engine dir on disk at a time
            p = run_child([sys.executable, __file__, "--plain-trt", str(spec_path)])
            plain_runs.append((p, json.loads(p.stdout)))

    med = statistics.median
    trt_wall, plain_wall = med(r.seconds for r, _ in trt_runs), med(p.seconds for p, _ in plain_runs)
    trt_proc, plain_proc = med(r.max_rss_bytes for r, _ in trt_runs), med(p.max_rss_bytes for p, _ in plain_runs)
    trt_above = med(res["peak_rss_bytes"] for _, res in trt_runs)
    plain_above = med(res["peak_rss_bytes"] for _, res in plain_runs)
    figures = {
        "model": "SmolLM2-135M-Instruct", "checkpoint_dtype": ckpt_dtype, "runs": args.runs,
        "weight_bytes_fp16": weight_bytes, "engine_bytes": trt_runs[0][1]["engine_bytes"],
        "plain_engine_bytes": plain_runs[0][1]["engine_bytes"],
        "trtbuild_wall_s": round(trt_wall, 3), "plain_trt_wall_s": round(plain_wall, 3),
        "ratio_wall_trtbuild_over_plain": round(trt_wall / plain_wall, 3),
        "trtbuild_internal_s": med(res["seconds"] for _, res in trt_runs),  # build() alone
        "trtbuild_tensorrt_s": med(res["tensorrt"]["build_seconds"] for _, res in trt_runs),
        "plain_trt_internal_s": med(res["seconds"] for _, res in plain_runs),  # parse + build + write
        # whole process: interpreter, imports (trtbuild loads onnxruntime, onnx_ir, ...) and the build
        "trtbuild_process_peak_rss_bytes": trt_proc, "plain_trt_process_peak_rss_bytes": plain_proc,
        "ratio_process_rss_trtbuild_over_plain": round(trt_proc / plain_proc, 3),
        # the work alone: high-water mark above the RSS at its start (trtbuild's manifest figure)
        "trtbuild_peak_rss_above_baseline_bytes": trt_above,
        "trtbuild_tensorrt_peak_rss_above_baseline_bytes": med(r["tensorrt"]["peak_rss_bytes"] for _, r in trt_runs),
        "plain_trt_peak_rss_above_baseline_bytes": plain_above,
        "ratio_peak_over_weights": round(trt_above / weight_bytes, 2),
        "ratio_process_peak_over_weights": round(trt_proc / weight_bytes, 2),
        "plain_ratio_peak_over_weights": round(plain_above / weight_bytes, 2),
        "ratio_goal": RATIO_GOAL,
        "trtbuild_wall_s_each": [round(r.seconds, 2) for r, _ in trt_runs],
        "plain_trt_wall_s_each": [round(p.seconds, 2) for p, _ in plain_runs],
        "loadavg_1m_at_start": load_at_start, "cpus": os.cpu_count(),
        "process_rss_source": RSS_SOURCE,
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    mb = 1e6
    f = figures
    print(f"SmolLM2-135M fp16 engine from a {ckpt_dtype} checkpoint: weights {weight_bytes / mb:.0f} MB fp16, "
          f"engine {f['engine_bytes'] / mb:.0f} MB (plain {f['plain_engine_bytes'] / mb:.0f} MB); "
          f"medians of {args.runs} alternating runs (load {load_at_start} on {os.cpu_count()} CPUs)")
    print(f"  build wall s      trtbuild {trt_wall:7.2f}  plain TensorRT-RTX {plain_wall:7.2f}  "
          f"ratio {f['ratio_wall_trtbuild_over_plain']}  "
          f"(each: {f['trtbuild_wall_s_each']} / {f['plain_trt_wall_s_each']})")
    print(f"  in-process s      trtbuild build() {f['trtbuild_internal_s']} (TensorRT {f['trtbuild_tensorrt_s']})  "
          f"plain {f['plain_trt_internal_s']}")
    print(f"  process peak RSS  trtbuild {trt_proc / mb:7.0f} MB  plain {plain_proc / mb:7.0f} MB  "
          f"ratio {f['ratio_process_rss_trtbuild_over_plain']}  [{f['process_rss_source']}]")
    print(f"  peak above start  trtbuild {trt_above / mb:7.0f} MB (manifest; TensorRT step "
          f"{f['trtbuild_tensorrt_peak_rss_above_baseline_bytes'] / mb:.0f} MB)  plain {plain_above / mb:7.0f} MB")
    print(f"  peak / weights    trtbuild {f['ratio_peak_over_weights']}x above start, "
          f"{f['ratio_process_peak_over_weights']}x whole process; plain {f['plain_ratio_peak_over_weights']}x "
          f"(goal <= {RATIO_GOAL}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
