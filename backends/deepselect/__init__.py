"""DeepSelect (``deep_select``, distribution ``tokenspeed-deepselect``): DeepSeek's top-k for sparse
attention, serving ``indexer_topk`` in the decode form on SM100 / SM103 (the wheel carries sm_100a
and sm_103a code only).

What ``deep_select.topk`` (1.0.0.post20260910) cannot do, and what the checks below decline:
  - row starts: ``begin`` is not supported (interface.py asserts it is None), so the range form
    (``row_starts`` / ``row_ends``) is declined; the decode form maps to ``end`` with start 0;
  - more than 4096 indices per row (``topk <= 4096`` in csrc/api.cpp; ``k > W`` is served as
    ``min(k, W)`` plus -1 columns);
  - rows of 2^23 columns or more (``vocab_size < 2^23``).
Its row-stride rule (input rows a multiple of 1024 bytes, unit column stride) is met by the
adapter's copy of the logits (``ops.py``), which it makes anyway to turn ``-inf`` into an ordinary
candidate; the 32-byte output row rule by writing into ``out`` only when ``k`` is a multiple of 8.
"""
from dsv4ops.backend_support import all_of, arch_in, import_probe
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend

ARCHS = ("sm100", "sm103")
MAX_TOPK = 4096
MAX_WIDTH = 1 << 23          # exclusive

BACKEND = register_backend(Backend(
    "deepselect", ("cuda",),
    probe=import_probe("deep_select", '"dsv4ops[deepselect]" (tokenspeed-deepselect, a CUDA build of torch)',
                       needs=("topk", "get_stride_requirement")),
    description="DeepSelect top-k (SM100 / SM103), decode rows",
))


def topk_inputs(plat: Platform, call) -> str | None:
    if call.seq_lens is None:
        return "row ranges: deep_select.topk has no row start (`begin` is not supported); decode form only"
    W = call.logits.shape[1]
    if W >= MAX_WIDTH:
        return f"rows of {W} columns: DeepSelect needs fewer than 2^23"
    if min(call.k, W) > MAX_TOPK:
        return f"k={call.k} > {MAX_TOPK} (DeepSelect's limit)"
    return None


# Below Triton until measured on SM100 hardware (priorities.OP_PRIORITY).
BACKEND.implements("indexer_topk", "dsv4ops.backends.deepselect.ops:indexer_topk",
                   supports=all_of(arch_in(*ARCHS), topk_inputs))
