"""Every Triton tunable in one place, chosen per platform (vendor, arch).

Values are starting points measured on the H100 (docs/perf/README.md); other targets inherit the
defaults until someone with the hardware tunes them.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from dsv4ops import settings
from dsv4ops.composition import DECODE_CHUNK_BYTES, PREFILL_CHUNK_BYTES
from dsv4ops.errors import ConfigError
from dsv4ops.platform import Platform


@dataclass(frozen=True)
class Tuning:
    decode_block_h: int = 32        # query heads per program (>= 16 for tl.dot)
    decode_block_k: int = 32        # cache rows per step (half when the two caches have different layouts)
    decode_warps: int = 8
    decode_stages: int = 1
    decode_waves: int = 2           # split the index list until about this many programs per SM
    prefill_block_h: int = 32       # sparse_mla_prefill: query heads per program (>= 16 for tl.dot)
    prefill_block_k: int = 32       # sparse_mla_prefill: cache rows per step (halved as decode_block_k)
    prefill_warps: int = 8
    prefill_stages: int = 1
    logits_block_t: int = 64        # compressed tokens per program
    logits_warps: int = 4
    mqa_block_q: int = 2            # mqa_logits: query rows per program (x H heads feed one tl.dot)
    mqa_block_s: int = 64           # mqa_logits: keys per tl.dot
    mqa_chunk_s: int = 1024         # mqa_logits: keys per program (a loop over its tiles)
    mqa_warps: int = 4
    mqa_stages: int = 2
    einsum_block_m: int = 64
    einsum_block_n: int = 128
    einsum_warps: int = 4
    einsum_stages: int = 3
    einsum_tma: int = 0             # 1: fp8 tiles through TMA descriptors where addresses and strides allow
    topk_block: int = 2048
    topk_warps: int = 8
    topk_resident: int = 32768      # the most positions a program selects from in registers
    topk_min_piece: int = 4096      # shortest piece a row is split into to fill the GPU
    topk_keys_per_thread: int = 32  # resident selection: keys each thread holds (sets the warps: >= 4, <= 1024 threads)
    topk_threshold_min: int = 16384  # rows at least this wide select through a sampled threshold (threshold_topk.py)
    topk_sample: int = 2048         # ... keys sampled per row for the threshold
    topk_sample_slack: int = 4      # ... its rank in the sample may exceed the aimed one by 1/this (a shorter search)
    topk_filter_block: int = 1024   # ... keys per step of a filter program (at least one per thread; 4+ load 16 bytes)
    topk_filter_warps: int = 4
    topk_filter_programs: int = 4   # ... filter programs per multiprocessor (sets the pieces a row is split into)
    fused_programs_per_sm: int = 4  # paged_mqa_topk / mqa_topk: stage-1 programs per multiprocessor (sets the pieces)
    fused_max_pieces: int = 4       # ... at most this many pieces a row (the workspace grows with them)
    fused_path: str = "auto"        # paged_mqa_topk / mqa_topk: stream (the fused kernel), chunks (logits, then top-k,
                                    # over chunks of rows whose logits fit the bytes below) or auto (chunks while
                                    # one request's logits fit, the fused kernel beyond: fused_chunk_budget)
    fused_chunk_bytes: int = DECODE_CHUNK_BYTES            # paged_mqa_topk's chunks
    fused_prefill_chunk_bytes: int = PREFILL_CHUNK_BYTES   # mqa_topk's chunks
    insert_heads: int = 4           # query heads per qnorm_rope_kv_insert program
    insert_warps: int = 4
    inv_rope_heads: int = 4         # heads per inv_rope_fp8_quant program
    inv_rope_warps: int = 4
    compress_warps: int = 4         # per 512 channels of the row (at least 1): state copy, whole-window pooling, entries
    compress_save_elems: int = 1024  # state values per copy program (tokens = max(1, this // row width))
    compress_chunk: int = 16        # window positions per pooling step
    compress_channels_c4: int = 512   # channels per pooling program; >= D: one program pools and writes
    compress_channels_c128: int = 64  # < D: (token, channel group) programs, then one writing the entry
    compress_pool_warps: int = 4    # the channel-group pooling programs
    compress_pool_tokens: int = 64  # tokens per pooling / entry program (it takes the windows they close in turn)
    compress_tokens: int = 1        # tokens per whole-window program (channels >= D) per 512 channels, at most the ratio
    pdl: int = 1                    # 1: programmatic dependent launch where the GPU has it (CUDA sm90+): the top-k's
                                    # threshold-path kernels start while the previous one finishes; 0: off
    fp8_path: str = "auto"          # fp8 arithmetic: auto (the platform's capability), soft (integer
                                    # decode / encode, bf16 / fp16 dots) or hw (fp8 dtypes and FP8 MMA)


_TABLE = {
    # sm90: each choice below is the fastest variant of its sweep on the H100 (the sweeps, their
    # artifacts and numbers: docs/perf/README.md, "Triton defaults on sm90"). Decode and prefill:
    # 64 heads x 128 rows per step, the index list split only up to one wave; logits: 128 tokens per
    # program; top-k: rows of 16384 columns and more through the sampled threshold (samples as small
    # as the sampled rank allows, from 1024 keys), its filter over 1024-key blocks at 64 programs per
    # SM (measured on the H200); narrower rows select in registers, one program per row (no piece
    # shorter than 8192 columns), streamed blocks of 8192 on 16 warps for a k too large for the
    # threshold path; insert: 4 heads per program on 2 warps; fp8_einsum through TMA descriptors;
    # C128 compressor pooled over 32 positions per step.
    ("cuda", "sm90"): Tuning(decode_block_h=64, decode_block_k=128, decode_warps=8, decode_waves=1,
                             prefill_block_h=64, prefill_block_k=128, prefill_warps=8, prefill_stages=1,
                             einsum_block_m=64, einsum_block_n=128, einsum_stages=4, einsum_tma=1,
                             logits_block_t=128,
                             mqa_block_q=2, mqa_block_s=128, mqa_chunk_s=2048, mqa_warps=8, mqa_stages=3,
                             topk_block=8192, topk_warps=16, topk_resident=16384, topk_min_piece=8192,
                             topk_sample=1024, topk_filter_block=1024, topk_filter_programs=64,
                             insert_heads=4, insert_warps=2, compress_chunk=32),
    ("cpu", None): Tuning(decode_block_h=16, decode_block_k=16, prefill_block_h=16, prefill_block_k=16,
                          topk_block=64, topk_resident=128, topk_min_piece=32, topk_threshold_min=256,
                          topk_sample=32, topk_filter_block=256, logits_block_t=16, mqa_block_s=16, mqa_chunk_s=32,
                          einsum_block_m=16, einsum_block_n=128),
}


FUSED_MAX_BLOCK = 32768     # the most candidates a fused top-k program selects from (16-bit slot counts)


def fused_cap(k: int, tile: int) -> int:
    """Candidate slots of a fused indexer's stage-1 program: ``k`` kept plus room for a tile of ``tile`` keys."""
    return k + max(k, tile)


def fused_topk_fits(k: int, tile: int) -> bool:
    """Whether the fused indexers' candidate slice (``fused_cap``, rounded up to a power of two) fits
    one program (``FUSED_MAX_BLOCK``); larger ``k`` run the chunked composition."""
    return 1 << (fused_cap(k, tile) - 1).bit_length() <= FUSED_MAX_BLOCK


LARGE_TOPK_CHUNK_BYTES = 16 << 20    # the chunks of a ``k`` too large for the fused indexers' kernel


def fused_chunk_budget(tune: Tuning, k: int, tile: int, row_bytes: int, budget: int) -> int | None:
    """The logits bytes per chunk when paged_mqa_topk / mqa_topk run as this backend's logits and
    top-k over chunks of requests (query rows), ``row_bytes`` each; None when the fused kernel runs.
    Chunks of ``budget`` with ``fused_path`` chunks, and with auto while one request's logits fit
    (faster than the fused kernel on the H100 at every production and sweep shape,
    docs/perf/README.md; longer ones stream, so that no workspace grows with the context); chunks of
    ``LARGE_TOPK_CHUNK_BYTES`` for a ``k`` too large for the fused kernel (``fused_topk_fits``)."""
    if not fused_topk_fits(k, tile):
        return LARGE_TOPK_CHUNK_BYTES
    if tune.fused_path == "chunks" or (tune.fused_path == "auto" and row_bytes <= budget):
        return budget
    return None


@dataclass(frozen=True)
class Target:
    """What a Triton wrapper knows of where it runs, bound once per dispatch decision (the backend's
    context): the platform, its tunables, Triton's threads per warp there, and the fp8 arithmetic
    path: ``fp8_soft`` False runs fp8 dtypes and FP8 MMA, True decodes and encodes e4m3 with
    integer operations and runs bf16 / fp16 dots (``fp8_path``); ``pdl``: kernels that wait for the
    previous grid with ``wait_for_prior_grid`` may be launched before it ends (``has_pdl``)."""

    platform: Platform
    tuning: Tuning
    warp_lanes: int
    fp8_soft: bool
    pdl: bool = False


def target(plat: Platform) -> Target:
    tune = tuning(plat)
    soft = tune.fp8_path == "soft" or (tune.fp8_path == "auto" and not has_fp8_mma(plat))
    return Target(plat, tune, warp_lanes(plat), soft, bool(tune.pdl) and has_pdl(plat))


def has_pdl(plat: Platform) -> bool:
    """Whether ``plat`` has programmatic dependent launch (a kernel launched while the previous one of
    its stream runs, its programs waiting for it at ``griddepcontrol.wait``): NVIDIA from sm90."""
    return plat.vendor == "cuda" and cuda_sm(plat) >= 90


def has_fp8_mma(plat: Platform) -> bool:
    """Whether ``plat`` has FP8 tensor cores and e4m3 conversions Triton lowers: NVIDIA from sm89
    (Ada, Hopper, Blackwell), AMD gfx942 / gfx950 (MFMA) and RDNA4 gfx12 (WMMA). NVIDIA before sm89
    and AMD gfx90a / gfx908 / RDNA3 (gfx11) have none. XPU and the interpreter keep Triton's own fp8
    types."""
    if plat.vendor == "cuda":
        return cuda_sm(plat) >= 89
    if plat.vendor == "rocm":
        return plat.arch in ("gfx942", "gfx950") or plat.arch.startswith("gfx12")
    return True


def cuda_sm(plat: Platform) -> int:
    """The compute capability of a CUDA arch tag as an integer (sm90 -> 90, sm121 -> 121; 0 when
    the tag is not ``sm<digits>``)."""
    digits = plat.arch[2:]
    return int(digits) if plat.arch.startswith("sm") and digits.isdigit() else 0


def tuning(plat: Platform) -> Tuning:
    """The platform's tunables, with ``DSV4OPS_TRITON_TUNING="decode_block_h=64,..."`` applied on top
    (for sweeps and for users tuning a new target)."""
    base = _TABLE.get(plat.key) or _TABLE.get((plat.vendor, None)) or Tuning()
    return _override(base, settings.current().triton_tuning, 1024 // warp_lanes(plat))


def warp_lanes(plat: Platform) -> int:
    """Threads per warp as Triton's ``num_warps`` counts them on ``plat``: 64 on AMD's CDNA GPUs
    (gfx9*, wave64), 32 elsewhere. A program has at most 1024 threads on every GPU."""
    return 64 if plat.vendor == "rocm" and plat.arch.startswith("gfx9") else 32


def _allowed(name: str, value: int | str, max_warps: int) -> str | None:
    """Why ``value`` cannot be tunable ``name`` (None if it can): block sizes are powers of two
    (``tl.arange``), at least 16 where they feed ``tl.dot``; warps a power of two up to 1024 threads;
    switches one of their listed values."""
    if name in _CHOICES:
        *first, last = _CHOICES[name]
        return None if value in _CHOICES[name] else f"{', '.join(map(str, first))} or {last}"
    power_of_two = value > 0 and not value & (value - 1)
    if name.endswith("_warps"):
        return None if power_of_two and value <= max_warps else f"a power of two from 1 to {max_warps} here"
    if name.endswith(("_stages", "_waves")):
        return None if value >= 1 else "at least 1"
    minimum = 16 if name in _DOT_OPERANDS else 1
    maximum = _MAXIMUM.get(name)
    if maximum is not None:
        return None if power_of_two and minimum <= value <= maximum else f"a power of two from {minimum} to {maximum}"
    return None if power_of_two and value >= minimum else f"a power of two, at least {minimum}"


_CHOICES = {"einsum_tma": (0, 1), "pdl": (0, 1), "fp8_path": ("auto", "soft", "hw"), "fused_path": ("auto", "stream", "chunks")}
_WORDS = ("fp8_path", "fused_path")     # tunables whose values are words, not integers
_MAXIMUM = {"topk_resident": 32768}     # a resident top-k counts its output slots in 16-bit fields
_DOT_OPERANDS = ("decode_block_h", "decode_block_k", "prefill_block_h", "prefill_block_k", "einsum_block_m",
                 "einsum_block_n", "mqa_block_s")


@functools.lru_cache(maxsize=32)
def _override(base: Tuning, spec: str, max_warps: int) -> Tuning:
    if not spec:
        return base
    fields = {f.name for f in dataclasses.fields(Tuning)}
    changes = {}
    for item in spec.split(","):
        name, _, value = (part.strip() for part in item.partition("="))
        if name not in fields or not (value.isdigit() or name in _WORDS):
            raise ConfigError(f"DSV4OPS_TRITON_TUNING: bad entry {item!r}; expected name=integer with a name "
                              f"from {sorted(fields)} (fp8_path=auto|soft|hw)")
        typed = value if name in _WORDS else int(value)
        why = _allowed(name, typed, max_warps)
        if why is not None:
            raise ConfigError(f"DSV4OPS_TRITON_TUNING: {name}={value} must be {why}")
        changes[name] = typed
    return dataclasses.replace(base, **changes)
