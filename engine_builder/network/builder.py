"""A thin node emitter over onnx_ir: readable unique names, shared constants, dtype helpers.

Node and value names follow the module that made them ("layers.3.attn/MatMul_1") so a
graph dump, an onnxruntime profile and a pass report point back to the code.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

# the exact float types activations may have; logits and rotary tables stay float32
FLOAT = ir.DataType.FLOAT
INT64 = ir.DataType.INT64


class GraphBuilder:
    def __init__(self, dtype: ir.DataType):
        self.dtype = dtype  # activation (compute) dtype
        self.tape = ir.tape.Tape()
        self._scope: list[str] = []
        self._names: Counter[str] = Counter()
        self._consts: dict[tuple, ir.Value] = {}
        self.initializers: list[ir.Value] = []

    # ---- naming -------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self, name: str, absolute: bool = False) -> Iterator[None]:
        """Name what is emitted inside after NAME (nested in the current scope unless absolute)."""
        saved = self._scope
        self._scope = [name] if absolute else [*saved, name]
        try:
            yield
        finally:
            self._scope = saved

    def _unique(self, base: str) -> str:
        prefix = ".".join(self._scope)
        key = f"{prefix}/{base}" if prefix else base
        self._names[key] += 1
        n = self._names[key]
        return key if n == 1 else f"{key}_{n - 1}"

    # ---- nodes --------------------------------------------------------------------------
    def op(self, op_type: str, *inputs: ir.Value | None, name: str | None = None,
           **attrs: Any) -> ir.Value:
        node_name = self._unique(name or op_type)
        out = self.tape.op(op_type, list(inputs), attributes=attrs or None, name=node_name)
        out.name = node_name
        return out

    def op_multi(self, op_type: str, *inputs: ir.Value | None, num_outputs: int,
                 name: str | None = None, **attrs: Any) -> Sequence[ir.Value]:
        node_name = self._unique(name or op_type)
        outs = self.tape.op_multi_out(op_type, list(inputs), attributes=attrs or None,
                                      num_outputs=num_outputs, name=node_name)
        for i, out in enumerate(outs):
            out.name = f"{node_name}:{i}"
        return outs

    def cast(self, x: ir.Value, dtype: ir.DataType) -> ir.Value:
        return self.op("Cast", x, to=dtype)

    # ---- constants ----------------------------------------------------------------------
    def initializer(self, value: ir.Value) -> ir.Value:
        self.initializers.append(value)
        return value

    def tensor(self, array: np.ndarray, name: str) -> ir.Value:
        """A named constant tensor (e.g. a rotary table), stored inline in model.onnx."""
        t = ir.tensor(array, name=name)
        return self.initializer(ir.Value(name=name, shape=ir.Shape(array.shape),
                                         type=ir.TensorType(t.dtype), const_value=t))

    def const(self, value: float | int | Sequence[float] | Sequence[int],
              dtype: ir.DataType | None = None) -> ir.Value:
        """A shared scalar or 1-D constant; floats default to the compute dtype."""
        dtype = dtype or (INT64 if _is_int(value) else self.dtype)
        array = np.asarray(value, dtype=dtype.numpy())
        key = (dtype, array.shape, array.tobytes())
        if key not in self._consts:
            text = "_".join(str(v) for v in np.atleast_1d(value))
            short = dtype.name.lower()
            # scalars and 1-D constants of equal values need different names: "0" vs "[0]"
            text = text if array.ndim == 0 else f"[{text}]"
            name = f"const.{short}.{text}" if len(text) <= 40 else f"const.{short}.{len(self._consts)}"
            self._consts[key] = self.tensor(array, name)
        return self._consts[key]

    def ints(self, values: Sequence[int]) -> ir.Value:
        """A 1-D int64 constant: shapes, axes, starts/ends of Slice."""
        return self.const(list(values), INT64)

    # ---- composite blocks used everywhere ----------------------------------------------
    def linear(self, x: ir.Value, weight: ir.Value, bias: ir.Value | None = None) -> ir.Value:
        """x @ weight.T (+ bias), weight in torch's [out, in] layout.

        The weight stays untransposed in the safetensors file (its bytes are referenced, never
        rewritten), so the Transpose is an explicit node; backends fold it, and int4/int8
        lowering passes want exactly this [out, in] layout.
        """
        y = self.op("MatMul", x, self.op("Transpose", weight, perm=[1, 0]))
        return self.op("Add", y, bias) if bias is not None else y


def _is_int(value: Any) -> bool:
    first = value[0] if isinstance(value, Sequence) and len(value) else value
    return isinstance(first, int | np.integer) and not isinstance(first, bool)
