"""Helpers shared by backend packages: library probes and common capability checks.

Capability checks have the shape ``check(platform, key) -> None | reason``; ``key`` is the call's
``DispatchKey`` (dtypes, devices, shapes without the leading dimension, non-float scalars), and
reading anything else raises.
"""
from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from typing import Callable, Iterable

import torch

from .formats import Layout
from .platform import Platform


def import_probe(module: str, install: str, needs: Iterable[str] = ()) -> Callable[[], str | None]:
    """A probe that imports ``module`` and checks it has the attributes ``needs``."""
    def probe() -> str | None:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # ImportError, OSError from ABI mismatches, ...
            return f"cannot import {module} ({type(exc).__name__}: {str(exc)[:160]}); install {install}"
        missing = [n for n in needs if _lookup(mod, n) is None]
        if missing:
            return f"{module} lacks {', '.join(missing)} (unsupported version)"
        return None
    return probe


def _lookup(mod, dotted: str):
    obj = mod
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            try:
                obj = importlib.import_module(f"{mod.__name__}.{dotted}")
            except Exception:
                return None
            return obj
    return obj


def all_of(*checks) -> Callable:
    """Combine capability checks; the first reason wins."""
    def check(plat: Platform, call) -> str | None:
        for c in checks:
            reason = c(plat, call)
            if reason is not None:
                return reason
        return None
    return check


def arch_in(*archs: str) -> Callable:
    def check(plat: Platform, call) -> str | None:
        if plat.arch not in archs:
            return f"arch {plat.arch} not supported (needs {', '.join(archs)})"
        return None
    return check


def layout_in(*names: str) -> Callable:
    """Accept only the named layouts (checked against the Layout table once, here)."""
    layouts = tuple(Layout.of(n) for n in names)

    def check(plat: Platform, call) -> str | None:
        if call.layout not in layouts:
            return f"layout {call.layout} not supported (needs {', '.join(names)})"
        return None
    return check


def index_mxfp4(call) -> str | None:
    """What of an indexer logits call (paged_mqa_logits, mqa_logits and their top-k forms) is MXFP4
    (DeepSeek-V4.1: packed e2m1, UE8M0 scales): "MXFP4 keys", "MXFP4 queries", or None (all fp8)."""
    kv, k = call.get("kv_cache"), call.get("k")
    if (kv is not None and kv.shape[-1] != 132) or (k is not None and k.dtype == torch.uint8):
        return "MXFP4 keys"
    return "MXFP4 queries" if call.q.dtype == torch.uint8 else None


def sm_major(arch: str) -> int:
    """'sm90' -> 9, 'sm100' -> 10, 'sm121' -> 12; 0 for non-CUDA arch tags."""
    digits = arch[2:] if arch.startswith("sm") else ""
    return int(digits[:-1]) if digits.isdigit() and len(digits) >= 2 else 0


def triton_interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def interpreter_on_cpu(device: torch.device, tool: str) -> None:
    """The command-line tools' one rule for a machine without a GPU (``check``, ``bench --tiny``,
    the examples): on a CPU device the Triton kernels run through Triton's interpreter, so set
    ``TRITON_INTERPRET=1`` (read when the kernels are first imported) and say so once on stderr. A
    library call never changes the environment: there, CPU tensors run the Triton kernels only under
    ``TRITON_INTERPRET=1`` and the reference otherwise."""
    if device.type != "cpu" or triton_interpreter_enabled():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    print(f"{tool}: no GPU, so the Triton kernels run through Triton's interpreter (TRITON_INTERPRET=1 set)",
          file=sys.stderr)


def decode_output(q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The caller's ``out`` or a new bf16 ``[T, H, 512]`` for sparse_mla_decode."""
    return torch.empty(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16, device=q.device) if out is None else out


def topk_output(a) -> torch.Tensor:
    """The caller's ``out`` or a new int32 ``[R, k]`` for indexer_topk (typed args ``a``)."""
    if a.out is not None:
        return a.out
    return torch.empty(a.logits.shape[0], a.k, dtype=torch.int32, device=a.logits.device)


def dense(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` contiguous (no copy when it already is), for vendor kernels that assume dense rows;
    None stays None. Index, length, sink and scale arguments are small, so the copy is cheap."""
    return None if t is None else t.contiguous()


def pad_heads(q: torch.Tensor, attn_sink: torch.Tensor | None, padded: int):
    """Zero query heads and -inf sinks (no effect) up to ``padded`` heads; no copy when already there.
    Returns (q [T, padded, 512], sink [padded] or None)."""
    T, H, D = q.shape
    if padded == H:
        return q, dense(attn_sink)
    q_p = torch.zeros(T, padded, D, dtype=q.dtype, device=q.device)
    q_p[:, :H] = q
    sink_p = None
    if attn_sink is not None:
        sink_p = torch.full((padded,), float("-inf"), dtype=torch.float32, device=q.device)
        sink_p[:H] = attn_sink
    return q_p, sink_p


def declared_signature(fn) -> inspect.Signature:
    """``inspect.signature(fn)``, or for a pybind11 builtin (DeepGEMM) the one its docstring's first line
    declares, ``name(a: T, b: U = default) -> R``: parameter names and whether each has a default."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        match = re.match(r"\w+\((.*)\) ->", (fn.__doc__ or "").split("\n")[0])
        if match is None:
            raise
    params, depth, current = [], 0, ""
    for ch in match.group(1) + ",":
        if ch == "," and depth == 0:
            params.append(current.strip())
            current = ""
            continue
        depth += (ch in "[(") - (ch in "])")
        current += ch
    return inspect.Signature([inspect.Parameter(p.split(":")[0].strip(), inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                default=None if "=" in p else inspect.Parameter.empty)
                              for p in params if p])
