"""Pass framework: registry, the rewrite-rule pass type, and the PassManager.

A pass is a pattern, a check that can say why it failed, and a rewrite. We build on
onnxscript's rewriter (its pattern matcher and MatchingTracer) rather than a matcher of our
own; what this module adds is naming, ordering, per-pass counts and the "why not" report.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter.pattern import MatchingTracer, MatchStatus

from engine_builder.util.errors import ConfigError

_REGISTRY: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Register a Pass subclass under its `name` (which is also its module's file name)."""
    _REGISTRY[cls.name] = cls
    return cls


def registered_passes() -> list[str]:
    return sorted(_REGISTRY)


def get_pass(name: str) -> Pass:
    if name not in _REGISTRY:
        raise ConfigError(f"unknown pass {name!r}; known passes: {', '.join(registered_passes())}")
    return _REGISTRY[name]()


@dataclass(frozen=True)
class PassResult:
    name: str
    matches: int
    # for a pass with no match: the closest partial match's failure, if any
    why_not: str | None = None


class Pass(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str] = ""

    @abc.abstractmethod
    def apply(self, model: ir.Model) -> int:
        """Rewrite `model` in place; return the number of rewrites. Must be idempotent."""

    def why_not(self, model: ir.Model) -> str | None:
        """The closest failed match, when `apply` found nothing."""
        return None


class RewritePass(Pass):
    """A pass made of onnxscript rewrite rules (pattern + check + rewrite)."""

    @abc.abstractmethod
    def rules(self) -> Sequence[pattern.RewriteRule]: ...

    def apply(self, model: ir.Model) -> int:
        return pattern.RewriteRuleSet(list(self.rules())).apply_to_model(model)

    def why_not(self, model: ir.Model) -> str | None:
        # With a tracer the rule set only records its best partial matches; it does not rewrite.
        tracer = MatchingTracer()
        pattern.RewriteRuleSet(list(self.rules())).apply_to_model(model, tracer=tracer)
        best = max((m for ms in tracer.best_matches_map.values() for m in ms if m.status != MatchStatus.SUCCESS),
                   key=lambda m: m.score(), default=None)
        if best is None:
            return "no node resembles the pattern"
        node = best.root_node
        reason = best.match_result.reason or "pattern did not match"
        kind = "check failed" if best.status == MatchStatus.CONDITION_FAILED else "closest match"
        return f"{kind} at {node.op_type} node {node.name!r}: {reason}"


# onnxruntime's contrib ops (FusedMatMul, MatMulNBits, SkipSimplifiedLayerNormalization...): only the twin's
# lowerings (lower_ort_*) emit them, and a model using them must import this domain
MS_DOMAIN = "com.microsoft"


class OrtContribRewritePass(RewritePass):
    """A RewritePass whose rewrites emit onnxruntime contrib ops: a model it changed imports their domain."""

    def apply(self, model: ir.Model) -> int:
        count = super().apply(model)
        if count:
            model.opset_imports.setdefault(MS_DOMAIN, 1)
        return count


class PassManager:
    """Runs passes by name in an explicit order and reports per-pass match counts."""

    def __init__(self, names: Sequence[str]):
        self.passes = [get_pass(n) for n in names]

    def run(self, model: ir.Model, explain: bool = False) -> list[PassResult]:
        results = []
        for p in self.passes:
            matches = p.apply(model)
            results.append(PassResult(p.name, matches, p.why_not(model) if explain and not matches else None))
        return results
