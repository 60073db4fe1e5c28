"""Argument checks shared by the op contracts. Every failure is an ``InputError`` naming the
argument and what was expected. Structural checks never synchronise the device; value checks
(ranges) run on CPU tensors always and on accelerator tensors only with ``DSV4OPS_DEBUG=1``."""
from __future__ import annotations

import collections
import math
from typing import Sequence

import torch

from .errors import InputError
from .settings import debug_enabled


def describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return f"{type(t).__name__} {t!r}" if not isinstance(t, (list, tuple)) else type(t).__name__
    dtype = str(t.dtype).replace("torch.", "")
    return f"{dtype} {list(t.shape)} on {t.device}"


INT32_MAX = 2 ** 31 - 1
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)      # tensors whose data_ptr is a real address


def byte_span(t: torch.Tensor) -> tuple[int, int] | None:
    """``[first, last)`` addresses of the bytes ``t`` can touch (None when it has no elements)."""
    if t.is_contiguous():
        start = t.data_ptr()
        return (start, start + t.numel() * t.element_size()) if t.numel() else None
    if t.numel() == 0:
        return None
    lo = hi = 0
    for size, stride in zip(t.shape, t.stride()):
        extent = (size - 1) * stride
        lo, hi = (lo + extent, hi) if extent < 0 else (lo, hi + extent)
    item = t.element_size()
    return t.data_ptr() + lo * item, t.data_ptr() + (hi + 1) * item


def spans_intersect(sa, sb) -> bool:
    """Whether two ``byte_span`` results share a byte (conservative for tensors: interleaved views of
    disjoint elements, such as the even and odd columns of one buffer, count as overlapping)."""
    return sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]


def self_overlapping(t: torch.Tensor) -> bool:
    """Whether two index tuples of ``t`` may address one element (an expanded or overlapping view)."""
    if t.is_contiguous():
        return False
    dims = sorted((abs(stride), size) for size, stride in zip(t.shape, t.stride()) if size > 1)
    reach = 0                           # elements spanned by the dims with smaller strides
    for stride, size in dims:
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride())


# The shape label of the per-token arguments of the cache writers (slot mappings): their length
# T' counts the tokens that write, a prefix of the call's T.
TOKENS_WRITTEN = "T' (tokens written, <= T)"


def _dtype_name(d) -> str:
    if isinstance(d, (tuple, list)):
        return " or ".join(_dtype_name(x) for x in d)
    return str(d).replace("torch.", "")


class Checker:
    """Checks for one op call; ``device`` is fixed by the first tensor checked with ``anchor=True``."""

    def __init__(self, op: str, args=None):
        self.op = op
        self.args = args                  # the typed args: the odd one out of a device mix is named
        self.device: torch.device | None = None
        self._anchor = ""
        self.debug = debug_enabled()
        self._spans: dict[str, tuple[int, int] | None] = {}      # byte spans of arguments (disjoint)

    def fail(self, arg: str, message: str):
        raise InputError(f"{self.op}: argument '{arg}' {message}")

    def tensor(self, name: str, t, *, dtype=None, shape: Sequence | None = None, anchor: bool = False,
               last_dim_contiguous: bool = False, contiguous: bool = False) -> torch.Tensor:
        """``shape`` entries: int (exact), None (any), or a str label (any; used in messages)."""
        want = self._expected(dtype, shape)
        if not isinstance(t, torch.Tensor):
            self.fail(name, f"must be a tensor {want}, got {describe(t)}")
        if dtype is not None:
            allowed = dtype if isinstance(dtype, (tuple, list)) else (dtype,)
            if t.dtype not in allowed:
                self.fail(name, f"must be {want}, got {describe(t)}")
        if shape is not None:
            if t.dim() != len(shape) or any(isinstance(s, int) and not isinstance(s, bool) and t.shape[i] != s
                                            for i, s in enumerate(shape)):
                self.fail(name, f"must be {want}, got {describe(t)}")
        if anchor and self.device is None:
            self.device, self._anchor = t.device, name
        elif self.device is not None and t.device != self.device:
            self._device_mix(name, t)
        if contiguous and not t.is_contiguous():
            self.fail(name, f"must be contiguous, got strides {t.stride()}")
        if last_dim_contiguous and t.dim() and t.stride(-1) != 1 and t.shape[-1] > 1:
            self.fail(name, f"must have stride 1 in its last dimension, got strides {t.stride()}")
        return t

    def _device_mix(self, name: str, t: torch.Tensor):
        """``t`` is not on the anchor's device: name whichever of the two is the odd one out (on
        the device fewer tensor arguments are on; ``name`` on a tie)."""
        tensors = {n: v for n, v in (self.args._asdict().items() if self.args is not None else ())
                   if isinstance(v, torch.Tensor)}
        on = collections.Counter(v.device for v in tensors.values())
        if on[self.device] < on[t.device] and self._anchor in tensors:
            self.fail(self._anchor, f"must be on {t.device} like the other inputs, got "
                                    f"{describe(tensors[self._anchor])}")
        self.fail(name, f"must be on {self.device} like the other inputs, got {describe(t)}")

    def optional(self, name: str, t, **kw):
        return None if t is None else self.tensor(name, t, **kw)

    @staticmethod
    def _expected(dtype, shape) -> str:
        parts = []
        if dtype is not None:
            parts.append(_dtype_name(dtype))
        if shape is not None:
            parts.append("[" + ", ".join(str(s) if s is not None else "*" for s in shape) + "]")
        return " ".join(parts) or "tensor"

    def int_arg(self, name: str, value, *, minimum: int | None = None, choices=None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(name, f"must be an int, got {describe(value)}")
        if minimum is not None and value < minimum:
            self.fail(name, f"must be >= {minimum}, got {value}")
        if choices is not None and value not in choices:
            self.fail(name, f"must be one of {sorted(choices)}, got {value}")
        return value

    def float_arg(self, name: str, value, *, positive: bool = False, tensor_ok: bool = False) -> None:
        """A finite float (``> 0`` with ``positive``); with ``tensor_ok`` also a 1-element fp32 tensor,
        whose value is checked under the value-check policy."""
        if tensor_ok and isinstance(value, torch.Tensor):
            self.tensor(name, value, dtype=torch.float32, shape=(1,))
            if positive:
                self.finite_positive(name, value)
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kinds = "a float or a 1-element fp32 tensor" if tensor_ok else "a float"
            self.fail(name, f"must be {kinds}, got {describe(value)}")
        if not math.isfinite(value):
            self.fail(name, f"must be finite, got {value}")
        if positive and not value > 0:
            self.fail(name, f"must be > 0, got {value}")

    def size_limit(self, name: str, value: int, limit: int = INT32_MAX, what: str = "size") -> None:
        """A size the kernels index with int32 (``value <= limit``)."""
        if value > limit:
            self.fail(name, f"{what} must be at most {limit} (the kernels index it with int32), got {value}")

    def bool_arg(self, name: str, value) -> bool:
        if not isinstance(value, bool):
            self.fail(name, f"must be a bool, got {value!r}")
        return value

    # -- value checks -------------------------------------------------------------------------
    def values_checked(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu" or self.debug

    def in_range(self, name: str, t: torch.Tensor | None, lo: int | None, hi: int, *,
                 allow: int | None = None, what: str = "values") -> None:
        """Every element in ``[lo, hi)`` (``lo=None``: only below ``hi``), or equal to ``allow``."""
        if t is None or t.numel() == 0 or not self.values_checked(t):
            return
        bad = t >= hi
        if lo is not None:
            bad |= t < lo
        if allow is not None:
            bad &= t != allow
        if bool(bad.any()):
            first = t[bad].flatten()[0].item()
            extra = f" or {allow}" if allow is not None else ""
            bounds = f"[{lo}, {hi})" if lo is not None else f"(-inf, {hi})"
            self.fail(name, f"{what} must lie in {bounds}{extra}, found {first}")

    def finite_positive(self, name: str, t: torch.Tensor | None, what: str = "scales") -> None:
        """Every element finite and > 0 (quantization scales)."""
        if t is None or t.numel() == 0 or not self.values_checked(t):
            return
        bad = ~(torch.isfinite(t) & (t > 0))
        if bool(bad.any()):
            self.fail(name, f"{what} must be finite and > 0, found {t[bad].flatten()[0].item()}")

    def not_nan(self, name: str, t: torch.Tensor | None) -> None:
        if t is not None and t.numel() and self.values_checked(t) and bool(t.isnan().any()):
            self.fail(name, "must not contain NaN (+-inf are allowed)")

    def not_above(self, name: str, t: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
        """Element-wise ``t <= other`` (a range start never past its end)."""
        if t.numel() == 0 or not self.values_checked(t):
            return
        bad = t > other
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            self.fail(name, f"must not exceed '{other_name}' (a range start past its end), found "
                            f"{int(t[row])} > {int(other[row])} at row {row}")

    # -- aliasing -------------------------------------------------------------------------------
    def disjoint(self, a, name: str, others: Sequence[str] | None = None, same_ok: Sequence[str] = ()) -> None:
        """The written tensor ``a.<name>`` must not overlap itself nor any other tensor of ``a``
        (``others``: only those), except being exactly the same view as an argument in ``same_ok``
        (the in-place forms the contract allows). Run after the device checks (one device)."""
        t = getattr(a, name)
        if type(t) not in _PLAIN_TENSORS or t.device.type == "meta":
            return                      # subclasses (FakeTensor under tracing, ...) have no real addresses
        if self_overlapping(t):
            self.fail(name, f"is written and must not overlap itself (an expanded view), got strides {t.stride()}")
        span = self._span(name, t)
        for other in (others if others is not None else a._fields):
            u = getattr(a, other)
            if other == name or type(u) not in _PLAIN_TENSORS or not spans_intersect(span, self._span(other, u)):
                continue
            if other in same_ok and same_view(t, u):
                continue
            allowed = f" (only the very same view as '{other}' is allowed)" if other in same_ok else ""
            self.fail(name, f"is written and must not overlap '{other}' in memory{allowed}")

    def _span(self, name: str, t: torch.Tensor):
        """``byte_span`` of argument ``name``, computed once per call."""
        if name not in self._spans:
            self._spans[name] = byte_span(t)
        return self._spans[name]

    def out_buffer(self, t, *, dtype, shape: tuple[int, ...]):
        if t is None:
            return None
        self.tensor("out", t, dtype=dtype, shape=shape, contiguous=True)
        return t
