"""Which implementation wins when several accept a call: one table, measured preferences as data.

``PRIORITY``: per backend, highest first; a vendor kernel outranks the portable Triton kernels,
which outrank the reference. Backends not in the table (out-of-tree plugins) give their own
``priority=`` when they register, or get ``PLUGIN_DEFAULT``.

``PREFERENCES``: measured exceptions. Each names the platform, the device models it was measured
on (``Platform.model``: a preference measured on the H100 does not apply to the H200, whose memory
and clocks differ), the op, the backend that wins, the one it beats, the condition (on the dispatch
key only) and the evidence. On a device no row names (an H800, a simulated sm90 without a name)
the general priorities above apply.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PRIORITY = {
    "flashmla": 100, "deepgemm": 100,        # vendor kernels measured fastest on SM90 (docs/perf/README.md)
    "flashinfer": 90, "deepselect": 90, "aiter": 80, "xpu": 80,
    "triton": 50,                            # portable: any Triton target
    "composed": 45,                          # the indexer in one call as its two dispatched ops
    "reference": 0,                          # the definition of correct; last resort
}
PLUGIN_DEFAULT = 60
# Per-op exceptions to PRIORITY: FlashInfer's and DeepSelect's top-k have not been measured against
# Triton's (nor run: SM100 only for DeepSelect), so they stay below it (FlashInfer's would otherwise
# win everywhere on CUDA).
OP_PRIORITY = {("indexer_topk", "flashinfer"): 40, ("indexer_topk", "deepselect"): 40}


@dataclass(frozen=True)
class Preference:
    op: str
    platform: tuple[str, str]              # (vendor, arch)
    prefer: str
    over: str
    when: Callable                         # (DispatchKey) -> bool
    evidence: str
    devices: tuple[str, ...] = ()          # the models measured (Platform.model); () = every device

    def applies_on(self, plat) -> bool:
        return self.platform == plat.key and (not self.devices or plat.model in self.devices)


PREFERENCES = (
    Preference(
        "sparse_mla_decode", ("cuda", "sm90"), prefer="triton", over="flashmla", devices=("H100",),
        when=lambda key: key.q.shape[1] <= 64 and key.size_class <= 8,
        evidence="H100 bench (docs/perf/H100-bench-attention.json): at 64 heads and T <= 128 tokens the Triton "
                 "kernel is 1.3-1.5x FlashMLA's (0.93x at T = 512, 0.69x at 128 heads); with H <= 16 heads "
                 "FlashMLA pads to 64 (1.2-1.6x up to T = 32 with the previous Triton tiles)"),
    Preference(
        "sparse_mla_prefill", ("cuda", "sm90"), prefer="triton", over="flashmla", devices=("H100",),
        when=lambda key: key.q.shape[1] <= 64 and key.size_class >= 12,
        evidence="H100 bench (docs/perf/H100-bench-attention.json): at 64 heads and T = 4096 tokens the Triton "
                 "kernel is 1.45x FlashMLA's with its workspace gather (0.82x at 128 heads); measured at "
                 "T >= 2048 only"),
    Preference(
        "paged_mqa_logits", ("cuda", "sm90"), prefer="triton", over="deepgemm", devices=("H100",),
        when=lambda key: key.q.shape[1] == 1 and key.max_context_len <= 8192,
        evidence="H100 bench (docs/perf/H100-bench.json, H100-bench-sweep-logits.json): one token per request "
                 "and up to 8K compressed tokens, the Triton kernel is 1.0-2.1x DeepGEMM's (B = 8-128); at "
                 "32K (0.87x at B = 128) and with next_n = 2 (0.89x) DeepGEMM is faster"),
    Preference(
        "paged_mqa_logits", ("cuda", "sm90"), prefer="triton", over="deepgemm", devices=("H200",),
        when=lambda key: key.q.shape[1] == 1 and key.max_context_len <= 1024,
        evidence="H200 bench (docs/perf/H200-bench-s20.txt:110-111, :34-35): one token per request, 1K "
                 "tokens, B = 64: the Triton kernel is 1.94x DeepGEMM's; at 8K, B = 128 it is 0.89x, so "
                 "DeepGEMM (the general priority) stays first there; 1K-8K not measured on the H200"),
)


def priority(op: str, backend: str, declared: int | None = None) -> int:
    """The base priority of ``backend``'s implementations of ``op``."""
    if (op, backend) in OP_PRIORITY:
        return OP_PRIORITY[(op, backend)]
    if backend in PRIORITY:
        return PRIORITY[backend]
    return PLUGIN_DEFAULT if declared is None else declared


def _applies(p: Preference, key) -> bool:
    try:
        return bool(p.when(key))
    except Exception:          # the preferred backend declines instead (preference_error)
        return False


def preferred(op: str, plat, key) -> dict[str, str]:
    """backend -> the backend it must outrank for this call on the ``Platform`` ``plat`` (from
    PREFERENCES)."""
    return {p.prefer: p.over for p in PREFERENCES if p.op == op and p.applies_on(plat) and _applies(p, key)}


def preference_error(op: str, plat, key, backend: str) -> str | None:
    """Why ``backend`` declines when one of its preferences' conditions raises, else None."""
    for p in PREFERENCES:
        if p.op == op and p.applies_on(plat) and p.prefer == backend:
            try:
                p.when(key)
            except Exception as exc:
                return f"preference over {p.over} raised {type(exc).__name__}: {exc}"
    return None
