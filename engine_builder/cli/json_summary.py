"""`--json` output people and CI can read: a summary of at most ~60 lines, the details in a file.

A SmolLM2 build's full result (every pass of both targets with its reasons, TensorRT's layer table,
two optimization profiles over 62 inputs) printed 2,681 lines. The engine dir's manifest
(config.json) already records all of it, so the summary names that file instead (`details`);
`--explain-passes` still prints each pass's result, since that is what it asks for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_builder.formats.checkpoint import CONFIG_FILE as MANIFEST_FILE  # the engine dir's manifest file

TRT_KEYS = ("flavour", "trt_version", "targets", "num_profiles", "build_seconds", "engine_bytes")


def pass_counts(passes: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """target -> "name matches, ..." on one line: what each pass found."""
    return {target: ", ".join(f"{r['name']} {r['matches']}" for r in results) for target, results in passes.items()}


def tensorrt_summary(report: dict[str, Any] | None) -> dict[str, Any] | None:
    if not report:
        return None
    layers = report.get("network_layer_types") or {}
    return {**{k: report[k] for k in TRT_KEYS if k in report}, "layers": sum(layers.values())}


def build_summary(result: dict[str, Any], explain: bool) -> dict[str, Any]:
    """BuildResult (as a dict) -> its summary; the manifest in OUT holds the rest."""
    summary = {k: v for k, v in result.items() if k not in ("passes", "tensorrt")}
    summary["passes"] = result["passes"] if explain else pass_counts(result["passes"])
    summary["tensorrt"] = tensorrt_summary(result["tensorrt"])
    summary["details"] = str(Path(result["out"]) / MANIFEST_FILE)
    return summary
