"""Work around the Triton interpreter's bf16 ``tl.dot`` (triton issue 11584).

The interpreter stores bf16 as uint16 and hands those raw bits to ``np.matmul``, so a bf16 dot
multiplies integers. The patch converts bf16 operands to float32 inside the interpreter's dot;
kernels are unchanged. Applied by the test setup and by ``dsv4ops check`` under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import functools


def patch_interpreter_bf16_dot() -> bool:
    """Patch once; returns False when Triton or its interpreter is not importable."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:
        return False
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_dsv4ops_patched", False):
        return True
    original = builder.create_dot

    @functools.wraps(original)
    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(x):
            if x.dtype.scalar == tl.bfloat16:
                data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
                return interpreter.TensorHandle(data, tl.float32)
            return x
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._dsv4ops_patched = True
    builder.create_dot = create_dot
    return True
