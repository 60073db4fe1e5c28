"""Work around five Triton interpreter bugs (``TRITON_INTERPRET=1``) in one place, never in the kernels.

1. bf16 ``tl.dot`` (triton issue 11584): the interpreter stores bf16 as uint16 and hands those raw
   bits to ``np.matmul``. The patch converts bf16 operands to float32 inside the interpreter's dot.
2. Float downcasts (fp32 -> bf16 / fp8): the interpreter's bit-level converter drops the carry when
   rounding overflows the mantissa (126.07 -> fp8 gives 64, not 128). The patch performs
   round-to-nearest-even downcasts with PyTorch's converters.
3. Scalars as loop bounds: the interpreter turns a scalar into ``int`` through ``int(array)``, which
   NumPy >= 2.4 refuses for 1-element arrays, so ``range(n)`` over a kernel argument fails. The
   patch reads the element instead.
4. Comparison results: the interpreter types ``a < b`` as the operands' type (int32 data holding
   booleans); a scalar comparison broadcast into a block then becomes int32 0/1, and masks built
   from it are rejected by Triton >= 3.9's ``tl.store`` ("mask has unsupported dtype"). The patch
   types every comparison as ``int1`` with boolean data, as compiled Triton does.
5. FNUZ fp8 (``tl.float8e4b8``, gfx942's e4m3): interpreters before Triton 3.9 cannot lower the type
   (``to_ir`` raises "fail to convert fp8e4b8 to ir type"), so kernels on float8_e4m3fnuz tensors
   fail there. The patch maps it to the builder's FNUZ type; conversions go through fix 2.

It also silences NumPy's RuntimeWarnings raised inside the interpreter (``inf - inf`` and the like),
where compiled kernels compute the same IEEE results silently, and runs ``tl.reduce`` with a
``combine_fn`` as a pairwise tree over whole slices of the reduced axis (the interpreter calls the
combine function once per element, on scalars: most of the top-k kernels' interpreted time). A tree
is the order compiled Triton combines in; the combine functions Triton accepts are associative.
Each call of a ``@triton.jit`` helper from a kernel re-patches the language modules (``_patch_lang``:
``inspect.getmembers`` over ``triton.language``, once per call per program, a quarter of the quick
tier's time) although the kernel's launch patched them already; inside a launch that is skipped.

Applied by the backend's probe (``backends/triton/__init__.py``), which runs before any Triton
kernel is selected, so direct calls, the CLI, the examples and the tests all get it.
"""
from __future__ import annotations

import functools
import warnings


def patch_triton_interpreter() -> bool:
    """Patch once; returns False when Triton or its interpreter is not importable."""
    try:
        import numpy as np
        import torch
        import triton.language as tl
        from triton._C.libtriton import ir
        from triton.runtime import interpreter
    except Exception:
        return False
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_dsv4ops_patched", False):
        return True

    original_dot = builder.create_dot

    @functools.wraps(original_dot)
    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(x):
            if x.dtype.scalar == tl.bfloat16:
                data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
                return interpreter.TensorHandle(data, tl.float32)
            return x
        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._dsv4ops_patched = True
    builder.create_dot = create_dot

    torch_of = {tl.bfloat16: torch.bfloat16, tl.float16: torch.float16, tl.float32: torch.float32,
                tl.float8e4nv: torch.float8_e4m3fn, tl.float8e4b8: torch.float8_e4m3fnuz,
                tl.float8e5: torch.float8_e5m2}
    original_convert = interpreter._convert_float

    @functools.wraps(original_convert)
    def convert_float(data, input_dtype, output_dtype, rounding_mode):
        src, dst = torch_of.get(input_dtype), torch_of.get(output_dtype)
        if src is None or dst is None or rounding_mode == ir.ROUNDING_MODE.RTZ:
            return original_convert(data, input_dtype, output_dtype, rounding_mode)
        raw = torch.from_numpy(np.ascontiguousarray(data)).view(src)
        bits = output_dtype.primitive_bitwidth
        return raw.to(torch.float32).to(dst).view(getattr(torch, f"uint{bits}")).numpy()

    interpreter._convert_float = convert_float

    original_patch_tensor = interpreter._patch_lang_tensor

    @functools.wraps(original_patch_tensor)
    def patch_lang_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor

    original_patch_core = interpreter._patch_lang_core

    @functools.wraps(original_patch_core)
    def patch_lang_core(lang, scope):
        original_patch_core(lang, scope)
        lowered = lang.dtype.to_ir

        def to_ir(self, ir_builder):
            if self.name == "fp8e4b8":
                return ir_builder.get_fp8e4b8_ty()
            return lowered(self, ir_builder)
        scope.set_attr(lang.dtype, "to_ir", to_ir)

    interpreter._patch_lang_core = patch_lang_core

    for name in dir(builder):
        if name.startswith(("create_icmp", "create_fcmp")):
            setattr(builder, name, _boolean_result(getattr(builder, name), interpreter.TensorHandle, tl.int1))
    if hasattr(interpreter, "ReduceOps"):          # speed only: where a Triton lacks these internals, skipped
        interpreter.ReduceOps.generic_reduce = _tree_reduce
    if hasattr(interpreter, "_LangPatchScope"):
        interpreter._patch_lang = _once_per_launch(interpreter._patch_lang, interpreter._LangPatchScope)
    return True


def _once_per_launch(patch_lang, scope_type):
    """``_patch_lang`` that does nothing for a helper whose language modules the launch in progress
    has patched already (until the launch restores them)."""
    import inspect

    import triton.language as tl

    patched: list[set] = []                  # per launch in progress: the language modules it patched

    def languages(fn) -> set:
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    @functools.wraps(patch_lang)
    def patch_once(fn):
        wanted = languages(fn)
        if patched and wanted <= patched[-1]:
            return scope_type()
        scope = patch_lang(fn)
        if patched:                          # a helper reaching another module: patched until the launch ends
            patched[-1] |= wanted
            return scope
        restore = scope.restore

        def restore_and_leave():
            patched.pop()
            restore()
        scope.restore = restore_and_leave
        patched.append(wanted)
        return scope
    return patch_once


def _tree_reduce(self, inputs):
    """``ReduceOps.generic_reduce`` (the interpreter's reduction with a ``combine_fn``): the reduced
    axis halved per step, element ``2i`` combined with ``2i + 1`` over whole slices at once."""
    import numpy as np
    import triton.language as tl

    inputs, axis = self.unravel(inputs, self.axis)
    dtypes = [t.dtype for t in inputs]
    data = [np.moveaxis(t.handle.data, axis, 0) for t in inputs]          # the reduced axis first
    while data[0].shape[0] > 1:
        pairs = data[0].shape[0] // 2
        left = [self.to_tensor(d[0:2 * pairs:2], dt) for d, dt in zip(data, dtypes)]
        right = [self.to_tensor(d[1:2 * pairs:2], dt) for d, dt in zip(data, dtypes)]
        combined = self.combine_fn.fn(*left, *right)
        combined = combined if isinstance(combined, tuple) else (combined,)
        shape = data[0][0:pairs].shape
        step = [np.broadcast_to(c.handle.data if isinstance(c, tl.core.tensor) else c, shape).astype(d.dtype)
                for c, d in zip(combined, data)]
        data = [np.concatenate([s, d[2 * pairs:]]) for s, d in zip(step, data)]   # an odd last element waits
    results = []
    for d, dt in zip(data, dtypes):
        value = d[0]
        if self.keep_dims:
            value = np.expand_dims(value, axis)          # axis None: the flattened input's one axis
        elif self.axis is None:
            value = value.item()
        results.append(self.to_tensor(value, dt))
    return results


def _boolean_result(compare, handle_type, int1):
    @functools.wraps(compare)
    def typed_compare(self, lhs, rhs):
        result = compare(self, lhs, rhs)
        return handle_type(result.data.astype(bool), int1)
    return typed_compare
