"""Cache formats: allocate, pack, unpack, and the index conversions of docs/ops.md §5.

KV cache layouts (``layout=``), docs/ops.md §1:

* ``"fp8_ds_mla"`` (FlashMLA MODEL1, V4): uint8 ``[num_blocks, page_bytes]``. A page holds
  ``block_size`` data rows of 576 B (448 fp8 NoPE values, then 64 little-endian bf16 RoPE values),
  then ``block_size`` scale rows of 8 B (7 UE8M0 bytes, one per 64-wide NoPE tile, then a 0 byte),
  then padding up to ``page_bytes = round_up(block_size * 584, 576)``.
  ``"fp8_ds_mla_fnuz"`` is the same with FNUZ e4m3 values (gfx942 writers).
* ``"mxfp8_v41"`` / ``"mxfp8_v41_inline"`` (V4.1 main cache, 528 B: 512 e4m3 + 16 UE8M0 scales) and
  ``"nvfp4_v41"`` / ``"nvfp4_v41_inline"`` (V4.1 compressed cache, 288 B: 256 e2m1 bytes + 32 e4m3
  scales): uint8 ``[num_blocks, page_bytes]``, any ``page_bytes >= block_size * token_bytes``;
  split pages (data rows, then scale rows) or inline (records back to back), docs/ops.md §6.6.
* ``"bf16"``: bf16 ``[num_blocks, block_size, 512]``.
* ``"fp8_per_tensor"``: float8_e4m3fn ``[num_blocks, block_size, 512]`` holding ``sat(k / kv_scale)``.

Indexer key caches (docs/ops.md §3): uint8 ``[num_blocks, block_size, 1, token_bytes]``; per page
the values of every token come first, then their scales (the strides of the 4-D view do not
describe single tokens). ``"index_fp8"`` (V4, 132 B): 128 fp8 values, one fp32 scale;
``"index_mxfp4"`` (V4.1, 68 B): 64 bytes of e2m1 pairs, 4 UE8M0 bytes (one per 32 values).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .quant import (
    FP8_DTYPE, FP8_MAX, MX_BLOCK, NV_BLOCK, as_float, decode_mxfp4, decode_mxfp8, decode_nvfp4, encode_mxfp4,
    encode_mxfp8, encode_nvfp4, pack_ue8m0_scales, to_fp8, ue8m0_scale, ue8m0_to_float,
)

HEAD_DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64
TILE = 64
NUM_TILES = NOPE_DIM // TILE            # 7 UE8M0 scale bytes per token
DS_MLA_DATA_BYTES = 576                 # 448 fp8 + 64 bf16
DS_MLA_SCALE_BYTES = 8                  # 7 scales + 1 zero pad byte
DS_MLA_TOKEN_BYTES = DS_MLA_DATA_BYTES + DS_MLA_SCALE_BYTES   # 584
DS_MLA_PAGE_ALIGN = 576
AMAX_FLOOR = 1e-4                       # vLLM writer rule (docs/ops.md §6)

MXFP8_DATA_BYTES, MXFP8_SCALE_BYTES = HEAD_DIM, HEAD_DIM // MX_BLOCK          # 512 + 16
MXFP8_TOKEN_BYTES = MXFP8_DATA_BYTES + MXFP8_SCALE_BYTES                      # 528
MXFP8_PAGE_ALIGN = 512
NVFP4_DATA_BYTES, NVFP4_SCALE_BYTES = HEAD_DIM // 2, HEAD_DIM // NV_BLOCK       # 256 + 32
NVFP4_TOKEN_BYTES = NVFP4_DATA_BYTES + NVFP4_SCALE_BYTES                      # 288
NVFP4_PAGE_ALIGN = 256

INDEX_DIM = 128
INDEX_TOKEN_BYTES = INDEX_DIM + 4       # 132: the V4 fp8 key
INDEX_MXFP4_TOKEN_BYTES = INDEX_DIM // 2 + INDEX_DIM // MX_BLOCK    # 68: the V4.1 MXFP4 key

@dataclass(frozen=True, eq=False)      # one instance per layout: compared and hashed by identity
class Layout:
    """A KV cache layout: every fact about it in one value (ops take the name or the value).

    ``kind`` is the code kernels branch on; ``query_dtype`` what ``sparse_mla_decode`` reads q as;
    ``fp8_flavour`` the e4m3 encoding of fp8 values ("ocp", "fnuz"; None for bf16);
    ``token_bytes`` the bytes one token occupies in a page (padding excluded)."""

    name: str
    kind: int
    cache_dtype: torch.dtype
    query_dtype: torch.dtype
    fp8_flavour: str | None
    token_bytes: int
    data_bytes: int = 0          # value bytes per token record (V4.1: 512 / 256)
    scale_bytes: int = 0         # scale bytes per token record (V4.1: 16 / 32)
    scale_block: int = 0         # values per scale byte (V4.1: 32 / 16)
    inline: bool = False         # False: split pages (data rows, then scale rows); True: records back to back
    page_align: int = 0          # default page padding (allocate_kv_cache); 0: none

    DS_MLA: ClassVar[int] = 0
    BF16: ClassVar[int] = 1
    FP8_PER_TENSOR: ClassVar[int] = 2
    INDEX_FP8: ClassVar[int] = 3          # the indexer key cache: 128 fp8 + an fp32 scale per token
    MXFP8: ClassVar[int] = 4              # V4.1: 512 e4m3 + 16 UE8M0 scales (528 B)
    NVFP4: ClassVar[int] = 5              # V4.1: 512 e2m1 (256 B) + 32 e4m3 scales (288 B)
    INDEX_MXFP4: ClassVar[int] = 6        # V4.1 indexer keys: 128 e2m1 (64 B) + 4 UE8M0 scales (68 B)

    @property
    def head_dim(self) -> int:
        """Values per token: 512 for the attention caches, 128 for the indexer key caches."""
        return INDEX_DIM if self.is_index else HEAD_DIM

    @property
    def is_index(self) -> bool:
        """An indexer key cache, uint8 ``[num_blocks, block_size, 1, token_bytes]`` (docs/ops.md §3)."""
        return self.kind in (Layout.INDEX_FP8, Layout.INDEX_MXFP4)

    @property
    def is_ds_mla(self) -> bool:
        return self.kind == Layout.DS_MLA

    @property
    def is_v41(self) -> bool:
        """A DeepSeek-V4.1 block-scaled record (mxfp8_v41*, nvfp4_v41*), docs/ops.md §6."""
        return self.kind in (Layout.MXFP8, Layout.NVFP4)

    @property
    def is_paged_bytes(self) -> bool:
        """The cache is uint8 ``[num_blocks, page_bytes]`` of token records (fp8_ds_mla, V4.1)."""
        return self.is_ds_mla or self.is_v41

    @property
    def has_tensor_scale(self) -> bool:
        """Values are ``k / kv_scale`` (fp8_per_tensor): the call's scales apply."""
        return self.kind == Layout.FP8_PER_TENSOR

    def page_bytes(self, block_size: int) -> int:
        """Default bytes per page: ``block_size * token_bytes`` rounded up to ``page_align``
        (fp8_ds_mla: ``round_up(block_size * 584, 576)``). V4.1 caches accept any page width
        ``>= min_page_bytes(block_size)``."""
        raw = self.min_page_bytes(block_size)
        return -(-raw // self.page_align) * self.page_align if self.page_align else raw

    def min_page_bytes(self, block_size: int) -> int:
        """``block_size * token_bytes``: the bytes a page's records occupy."""
        return block_size * self.token_bytes

    def cache_shape(self, num_blocks: int, block_size: int, page_bytes: int | None = None) -> tuple[int, ...]:
        if self.is_paged_bytes:
            return (num_blocks, self.page_bytes(block_size) if page_bytes is None else page_bytes)
        if self.is_index:
            return (num_blocks, block_size, 1, self.token_bytes)
        return (num_blocks, block_size, HEAD_DIM)

    @staticmethod
    def of(layout: "Layout | str", among: dict | None = None) -> "Layout":
        """The Layout named ``layout`` among ``among`` (default: the attention KV cache layouts,
        ``LAYOUTS``); a Layout is returned as is if it is one of them; ValueError otherwise."""
        among = LAYOUTS if among is None else among
        found = layout if isinstance(layout, Layout) else among.get(layout) if isinstance(layout, str) else None
        if found is None or among.get(found.name) is not found:
            raise ValueError(f"unknown layout {layout!r}; expected one of {list(among)}")
        return found

    def __str__(self) -> str:
        return self.name


_DS_MLA_RECORD = dict(data_bytes=DS_MLA_DATA_BYTES, scale_bytes=DS_MLA_SCALE_BYTES, scale_block=TILE,
                      page_align=DS_MLA_PAGE_ALIGN)
_MXFP8_RECORD = dict(data_bytes=MXFP8_DATA_BYTES, scale_bytes=MXFP8_SCALE_BYTES, scale_block=MX_BLOCK,
                     page_align=MXFP8_PAGE_ALIGN)
_NVFP4_RECORD = dict(data_bytes=NVFP4_DATA_BYTES, scale_bytes=NVFP4_SCALE_BYTES, scale_block=NV_BLOCK,
                     page_align=NVFP4_PAGE_ALIGN)
_V41 = (torch.uint8, torch.bfloat16, "ocp")
LAYOUTS = {layout.name: layout for layout in (
    Layout("fp8_ds_mla", Layout.DS_MLA, torch.uint8, torch.bfloat16, "ocp", DS_MLA_TOKEN_BYTES, **_DS_MLA_RECORD),
    Layout("fp8_ds_mla_fnuz", Layout.DS_MLA, torch.uint8, torch.bfloat16, "fnuz", DS_MLA_TOKEN_BYTES,
           **_DS_MLA_RECORD),
    Layout("bf16", Layout.BF16, torch.bfloat16, torch.bfloat16, None, HEAD_DIM * 2),
    Layout("fp8_per_tensor", Layout.FP8_PER_TENSOR, torch.float8_e4m3fn, torch.float8_e4m3fn, "ocp", HEAD_DIM),
    Layout("mxfp8_v41", Layout.MXFP8, *_V41, MXFP8_TOKEN_BYTES, **_MXFP8_RECORD),
    Layout("mxfp8_v41_inline", Layout.MXFP8, *_V41, MXFP8_TOKEN_BYTES, inline=True, **_MXFP8_RECORD),
    Layout("nvfp4_v41", Layout.NVFP4, *_V41, NVFP4_TOKEN_BYTES, **_NVFP4_RECORD),
    Layout("nvfp4_v41_inline", Layout.NVFP4, *_V41, NVFP4_TOKEN_BYTES, inline=True, **_NVFP4_RECORD),
)}
# What a main (SWA) cache may be, the ``layout=`` of the attention ops and of qnorm_rope_kv_insert:
# every attention layout but NVFP4, which holds compressed entries only (an ``extra_layout``).
MAIN_LAYOUTS = {name: layout for name, layout in LAYOUTS.items() if layout.kind != Layout.NVFP4}
# The indexer key caches (docs/ops.md §3): written by compress_kv_insert, read by paged_mqa_logits.
INDEX_FP8 = Layout("index_fp8", Layout.INDEX_FP8, torch.uint8, torch.float8_e4m3fn, "ocp", INDEX_TOKEN_BYTES,
                   data_bytes=INDEX_DIM, scale_bytes=4, scale_block=INDEX_DIM)
INDEX_MXFP4 = Layout("index_mxfp4", Layout.INDEX_MXFP4, torch.uint8, torch.uint8, None, INDEX_MXFP4_TOKEN_BYTES,
                     data_bytes=INDEX_DIM // 2, scale_bytes=INDEX_DIM // MX_BLOCK, scale_block=MX_BLOCK)
INDEX_LAYOUTS = {layout.name: layout for layout in (INDEX_FP8, INDEX_MXFP4)}
# What the compressor writes: the attention entries (V4 fp8_ds_mla, V4.1 records) or the indexer keys.
COMPRESSED_LAYOUTS = {"fp8_ds_mla": LAYOUTS["fp8_ds_mla"], **INDEX_LAYOUTS,
                      **{name: LAYOUTS[name] for name in ("nvfp4_v41", "nvfp4_v41_inline", "mxfp8_v41",
                                                          "mxfp8_v41_inline")}}
V4_COMPRESSION_RATIOS = (4, 128)                # C4 (overlapping windows) and C128 (docs/ops.md §9)
V41_COMPRESSION_RATIOS = (2, 1)                 # DeepSeek-V4.1: pairs, and every token its own entry
COMPRESSION_RATIOS = V4_COMPRESSION_RATIOS + V41_COMPRESSION_RATIOS


def window_overlap(ratio: int) -> int:
    """Compressor windows pooled per entry: 2 for C4 (each window also pools the previous ratio
    tokens), else 1; the state rows and projections are ``window_overlap(ratio) * head_dim`` wide."""
    return 2 if ratio == 4 else 1
ALL_LAYOUTS = {**LAYOUTS, **COMPRESSED_LAYOUTS}


def ds_mla_page_bytes(block_size: int) -> int:
    """Bytes per page of the fp8_ds_mla layout: ``round_up(block_size * 584, 576)``."""
    return LAYOUTS["fp8_ds_mla"].page_bytes(block_size)


def kv_cache_spec(num_blocks: int, block_size: int, layout, page_bytes: int | None = None
                  ) -> tuple[tuple[int, ...], torch.dtype]:
    """(shape, dtype) of a KV cache in ``layout``; ``page_bytes`` (byte-paged layouts only, default
    ``layout.page_bytes(block_size)``) must be ``>= block_size * token_bytes``."""
    layout = Layout.of(layout)
    if page_bytes is not None:
        if not layout.is_paged_bytes:
            raise ValueError(f"page_bytes applies to byte-paged layouts only, not {layout}")
        if page_bytes < layout.min_page_bytes(block_size):
            raise ValueError(f"page_bytes must be >= block_size * {layout.token_bytes} = "
                             f"{layout.min_page_bytes(block_size)} for {layout}, got {page_bytes}")
    return layout.cache_shape(num_blocks, block_size, page_bytes), layout.cache_dtype


def allocate_kv_cache(num_blocks: int, block_size: int, layout: str, device="cpu",
                      page_bytes: int | None = None) -> torch.Tensor:
    """A zero-filled KV cache of ``num_blocks`` pages of ``block_size`` tokens in ``layout``."""
    shape, dtype = kv_cache_spec(num_blocks, block_size, layout, page_bytes)
    return torch.zeros(shape, dtype=dtype, device=device)


def record_views(cache: torch.Tensor, layout, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The value bytes ``[num_blocks, block_size, data_bytes]`` and scale bytes
    ``[num_blocks, block_size, scale_bytes]`` of a byte-paged cache (fp8_ds_mla, V4.1; split or
    inline pages, any page pitch ``cache.stride(0)``), as views sharing its storage."""
    layout = Layout.of(layout)
    nb, data_bytes, scale_bytes = cache.shape[0], layout.data_bytes, layout.scale_bytes
    if layout.inline:
        records = cache[:, :layout.min_page_bytes(block_size)].view(nb, block_size, layout.token_bytes)
        return records[..., :data_bytes], records[..., data_bytes:]
    data_end = block_size * data_bytes
    data = cache[:, :data_end].view(nb, block_size, data_bytes)
    scales = cache[:, data_end:data_end + block_size * scale_bytes].view(nb, block_size, scale_bytes)
    return data, scales


def ds_mla_views(cache: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data rows ``[num_blocks, block_size, 576]`` and scale rows ``[num_blocks, block_size, 8]``
    of an fp8_ds_mla cache, as views sharing its storage."""
    return record_views(cache, LAYOUTS["fp8_ds_mla"], block_size)


def encode_ds_mla(rows: torch.Tensor, flavour: str = "ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize rows ``[N, 512]`` to MODEL1 records: data uint8 ``[N, 576]``, scales uint8 ``[N, 8]``.

    NoPE tiles use the vLLM writer rule (docs/ops.md §1); the RoPE part is stored as bf16.
    """
    rows = rows.to(torch.float32)
    n = rows.shape[0]
    tiles = rows[:, :NOPE_DIM].reshape(n, NUM_TILES, TILE)
    amax = tiles.abs().amax(-1).clamp_min(AMAX_FLOOR)
    scale, byte = ue8m0_scale(amax, flavour)
    values = to_fp8(tiles / scale.unsqueeze(-1), flavour).reshape(n, NOPE_DIM).view(torch.uint8)
    rope = rows[:, NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)
    data = torch.cat([values, rope], dim=1)
    scales = torch.cat([byte, torch.zeros(n, 1, dtype=torch.uint8, device=rows.device)], dim=1)
    return data, scales


def decode_ds_mla(data: torch.Tensor, scales: torch.Tensor, flavour: str = "ocp") -> torch.Tensor:
    """MODEL1 records (data ``[..., 576]``, scales ``[..., 8]``) -> fp32 rows ``[..., 512]``."""
    lead = data.shape[:-1]
    values = data[..., :NOPE_DIM].contiguous().view(FP8_DTYPE[flavour]).to(torch.float32)
    tile_scale = ue8m0_to_float(scales[..., :NUM_TILES])
    nope = (values.reshape(*lead, NUM_TILES, TILE) * tile_scale.unsqueeze(-1)).reshape(*lead, NOPE_DIM)
    rope = data[..., NOPE_DIM:].contiguous().view(torch.bfloat16).to(torch.float32)
    return torch.cat([nope, rope], dim=-1)


def encode_records(rows: torch.Tensor, layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[N, 512]`` -> (value bytes ``[N, data_bytes]``, scale bytes ``[N, scale_bytes]``) of a
    byte-paged ``layout``."""
    layout = Layout.of(layout)
    if layout.kind == Layout.MXFP8:
        return encode_mxfp8(rows)
    if layout.kind == Layout.NVFP4:
        return encode_nvfp4(rows)
    return encode_ds_mla(rows, layout.fp8_flavour)


def decode_records(data: torch.Tensor, scales: torch.Tensor, layout) -> torch.Tensor:
    """(value bytes ``[..., data_bytes]``, scale bytes ``[..., scale_bytes]``) -> fp32 ``[..., 512]``."""
    layout = Layout.of(layout)
    if layout.kind == Layout.MXFP8:
        return decode_mxfp8(data, scales)
    if layout.kind == Layout.NVFP4:
        return decode_nvfp4(data, scales)
    return decode_ds_mla(data, scales, layout.fp8_flavour)


def write_kv(cache: torch.Tensor, layout: str, block_size: int, slots: torch.Tensor,
             rows: torch.Tensor, kv_scale=1.0) -> None:
    """Write rows ``[N, 512]`` (fp32 or bf16 values) at ``slots`` (int64 ``[N]``; ``< 0`` skipped)."""
    layout = Layout.of(layout)
    keep = slots >= 0
    slots, rows = slots[keep], rows[keep]
    block, offset = slots // block_size, slots % block_size
    if layout.is_paged_bytes:
        data, scales = encode_records(rows, layout)
        data_view, scale_view = record_views(cache, layout, block_size)
        data_view[block, offset] = data
        scale_view[block, offset] = scales
    elif layout.has_tensor_scale:
        cache[block, offset] = to_fp8(rows.to(torch.float32) / as_float(kv_scale))
    else:
        cache[block, offset] = rows.to(torch.bfloat16)


def read_kv(cache: torch.Tensor, layout: str, block_size: int, slots: torch.Tensor,
            kv_scale=1.0) -> torch.Tensor:
    """Dequantized fp32 rows ``[*slots.shape, 512]`` at valid ``slots`` (any int dtype)."""
    layout = Layout.of(layout)
    slots = slots.to(torch.int64)
    block, offset = slots // block_size, slots % block_size
    if layout.is_paged_bytes:
        data_view, scale_view = record_views(cache, layout, block_size)
        return decode_records(data_view[block, offset], scale_view[block, offset], layout)
    if layout.has_tensor_scale:
        return cache[block, offset].to(torch.float32) * as_float(kv_scale)
    return cache[block, offset].to(torch.float32)


def pack_kv(rows: torch.Tensor, layout: str, block_size: int, kv_scale=1.0,
            page_bytes: int | None = None) -> torch.Tensor:
    """Rows ``[num_blocks * block_size, 512]`` in slot order -> a new cache in ``layout``."""
    if rows.dim() != 2 or rows.shape[1] != HEAD_DIM or rows.shape[0] % block_size:
        raise ValueError(f"pack_kv: rows must be [num_blocks * {block_size}, {HEAD_DIM}], got {list(rows.shape)}")
    cache = allocate_kv_cache(rows.shape[0] // block_size, block_size, layout, rows.device, page_bytes)
    slots = torch.arange(rows.shape[0], device=rows.device)
    write_kv(cache, layout, block_size, slots, rows, kv_scale)
    return cache


def unpack_kv(cache: torch.Tensor, layout: str, block_size: int, kv_scale=1.0) -> torch.Tensor:
    """A cache in ``layout`` -> fp32 rows ``[num_blocks * block_size, 512]`` in slot order."""
    slots = torch.arange(cache.shape[0] * block_size, device=cache.device)
    return read_kv(cache, layout, block_size, slots, kv_scale)


def convert_kv_cache(cache: torch.Tensor, src_layout, dst_layout, block_size: int,
                     page_bytes: int | None = None) -> torch.Tensor:
    """A new cache holding ``cache``'s tokens in ``dst_layout`` (PD-disaggregation handoff), pages of
    ``page_bytes`` (default ``dst_layout.page_bytes(block_size)``); padding bytes are zero.

    Lossless between layouts of one record kind (split <-> inline, any page widths): the record
    bytes are copied. ``fp8_ds_mla`` <-> ``mxfp8_v41*`` requantizes (lossy, docs/ops.md §6): the
    rows are decoded to fp32 and encoded with the destination codec.
    """
    src, dst = Layout.of(src_layout), Layout.of(dst_layout)
    same_kind = src.kind == dst.kind and src.fp8_flavour == dst.fp8_flavour
    requant = {src.kind, dst.kind} == {Layout.DS_MLA, Layout.MXFP8} and "fnuz" not in (src.fp8_flavour,
                                                                                      dst.fp8_flavour)
    if not (src.is_paged_bytes and dst.is_paged_bytes and (same_kind or requant)):
        raise ValueError(f"convert_kv_cache: no conversion from {src} to {dst}; supported: between layouts "
                         f"of one record kind, and between fp8_ds_mla and mxfp8_v41*")
    if cache.dtype != torch.uint8 or cache.dim() != 2 or cache.shape[1] < src.min_page_bytes(block_size):
        raise ValueError(f"convert_kv_cache: cache must be uint8 [num_blocks, >= {src.min_page_bytes(block_size)}] "
                         f"for {src} with block_size {block_size}, got {cache.dtype} {list(cache.shape)}")
    out = allocate_kv_cache(cache.shape[0], block_size, dst, cache.device, page_bytes)
    data, scales = record_views(cache, src, block_size)
    out_data, out_scales = record_views(out, dst, block_size)
    if same_kind:
        out_data.copy_(data)
        out_scales.copy_(scales)
    else:
        rows = decode_records(data, scales, src).reshape(-1, HEAD_DIM)
        new_data, new_scales = encode_records(rows, dst)
        out_data.copy_(new_data.view(out_data.shape))
        out_scales.copy_(new_scales.view(out_scales.shape))
    return out


# ---------------------------------------------------------------------------------------------
# Indexer key cache (docs/ops.md §3)

def index_layout(cache_or_layout) -> Layout:
    """The indexer key layout of a cache (by its last dim: 132 or 68 bytes) or of a layout name."""
    if isinstance(cache_or_layout, torch.Tensor):
        by_bytes = {layout.token_bytes: layout for layout in INDEX_LAYOUTS.values()}
        width = cache_or_layout.shape[-1] if cache_or_layout.dim() else None
        if width not in by_bytes:
            raise ValueError(f"an indexer key cache ends in one of {sorted(by_bytes)} bytes per token, "
                             f"got shape {list(cache_or_layout.shape)}")
        return by_bytes[width]
    return Layout.of(cache_or_layout, INDEX_LAYOUTS)


def pack_index_keys(keys: torch.Tensor, scale_fmt: str = "fp32", layout="index_fp8") -> torch.Tensor:
    """Keys ``[num_blocks, block_size, 128]`` -> uint8 ``[num_blocks, block_size, 1, token_bytes]``.

    ``"index_fp8"`` (132 B): per token ``scale = amax / 448`` (``scale_fmt="fp32"``, DeepGEMM test
    style) or the power of two ``2**ceil(log2(amax / 448))`` (``"ue8m0"``, V4 compressor style),
    with ``amax >= 1e-4``; values ``sat_e4m3(k / scale)``; fp32 scales after the page's values.
    ``"index_mxfp4"`` (68 B): ``quant.encode_mxfp4`` per token (``scale_fmt`` is not used); the
    page's 64 B value rows, then its 4 B UE8M0 rows.
    """
    layout = index_layout(layout)
    if keys.dim() != 3 or keys.shape[-1] != INDEX_DIM:
        raise ValueError(f"pack_index_keys: keys must be [num_blocks, block_size, {INDEX_DIM}], got {list(keys.shape)}")
    if scale_fmt not in ("fp32", "ue8m0"):
        raise ValueError(f"pack_index_keys: scale_fmt must be 'fp32' or 'ue8m0', got {scale_fmt!r}")
    nb, bs, _ = keys.shape
    keys = keys.to(torch.float32)
    if layout.kind == Layout.INDEX_MXFP4:
        values, scale_bytes = encode_mxfp4(keys.reshape(nb * bs, INDEX_DIM))
    else:
        amax = keys.abs().amax(-1).clamp_min(AMAX_FLOOR)
        scale = amax / FP8_MAX["ocp"] if scale_fmt == "fp32" else ue8m0_scale(amax)[0]
        values = to_fp8(keys / scale.unsqueeze(-1)).view(torch.uint8)
        scale_bytes = scale.contiguous().view(torch.uint8)
    page = torch.cat([values.reshape(nb, bs * layout.data_bytes), scale_bytes.reshape(nb, bs * layout.scale_bytes)],
                     dim=1)
    return page.view(nb, bs, 1, layout.token_bytes)


def index_key_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The values and scales of an indexer key cache, as views of its storage: 132 B keys give fp8
    ``[num_blocks, block_size, 128]`` and fp32 ``[num_blocks, block_size]``; 68 B keys give packed
    e2m1 uint8 ``[num_blocks, block_size, 64]`` and UE8M0 uint8 ``[num_blocks, block_size, 4]``."""
    layout = index_layout(cache)
    nb, bs = cache.shape[0], cache.shape[1]
    flat = cache.reshape(nb, bs * layout.token_bytes)
    values = flat[:, :bs * layout.data_bytes].view(nb, bs, layout.data_bytes)
    scales = flat[:, bs * layout.data_bytes:].view(nb, bs, layout.scale_bytes)
    if layout.kind == Layout.INDEX_MXFP4:
        return values, scales
    return values.view(torch.float8_e4m3fn), scales.contiguous().view(torch.float32).view(nb, bs)


def unpack_index_keys(cache: torch.Tensor) -> torch.Tensor:
    """Indexer key cache (132 B or 68 B keys) -> dequantized fp32 keys ``[num_blocks, block_size, 128]``."""
    values, scales = index_key_views(cache)
    if index_layout(cache).kind == Layout.INDEX_MXFP4:
        return decode_mxfp4(values, scales)
    return values.to(torch.float32) * scales.unsqueeze(-1)


def index_vectors(values: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
    """Indexer queries or keys -> fp32 ``[..., 128]``: fp8 e4m3 ``[..., 128]`` (times fp32 ``scales
    [...]`` when given), or MXFP4: packed e2m1 uint8 ``[..., 64]`` with UE8M0 bytes uint8 ``[..., 4]``
    (docs/ops.md §3, §11)."""
    if values.dtype == torch.uint8:
        return decode_mxfp4(values, scales)
    out = values.to(torch.float32)
    return out if scales is None else out * scales.unsqueeze(-1)


# ---------------------------------------------------------------------------------------------
# Request-local -> global cache indices (docs/ops.md §5, vLLM ComputeGlobalTopkIndicesAndLens)

def to_global_indices(local: torch.Tensor, block_table: torch.Tensor, token_to_req: torch.Tensor,
                      block_size: int, is_valid_token: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Map request-local compressed indices to cache indices for ``sparse_mla_decode``.

    local int32 ``[T, k]`` (negative = none), block_table int32 ``[num_reqs, max_blocks]`` (any
    strides), token_to_req int ``[T]``, is_valid_token bool ``[T]`` (default all valid).
    An entry is kept when it is >= 0, its token's request id is in ``[0, num_reqs)`` and its block
    ``l // bs`` is in ``[0, max_blocks)``; kept entries become ``block_table[r, l // bs] * bs + l % bs``
    and are packed to the left of the row (in their order), -1 after them (vLLM's
    ``compute_global_topk_indices_and_lens`` contract).
    Returns (global int32 ``[T, k]``, lens int32 ``[T]`` = kept entries, 0 for invalid tokens).
    """
    num_reqs, max_blocks = block_table.shape
    req = token_to_req.to(torch.int64)
    block = local.to(torch.int64).div(block_size, rounding_mode="floor")
    keep = (local >= 0) & (block < max_blocks) & ((req >= 0) & (req < num_reqs))[:, None]
    if block_table.numel():
        rows = block_table[req.clamp(0, num_reqs - 1)].to(torch.int64)
        pages = torch.gather(rows, 1, torch.where(keep, block, 0))
    else:
        pages = torch.zeros_like(block)
    glob = torch.where(keep, pages * block_size + local.to(torch.int64) % block_size, -1).to(torch.int32)
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices     # kept entries first
    lens = keep.sum(1, dtype=torch.int32)
    if is_valid_token is not None:
        lens = torch.where(is_valid_token, lens, torch.zeros_like(lens))
    return glob.gather(1, order), lens


# ---------------------------------------------------------------------------------------------
# The two-level indexer's compressed columns (docs/ops.md §14-§16)

def candidate_positions(local: torch.Tensor, blocks: torch.Tensor, sparse_block: int) -> torch.Tensor:
    """Columns of a sparse logits row -> row-local positions: ``local`` int ``[R, k]`` (negative =
    none, e.g. ``indexer_topk`` of ``paged_sparse_mqa_logits`` / ``sparse_mqa_logits``), ``blocks``
    int32 ``[R, num_blocks]`` the candidate blocks those logits were computed over. Entry ``l >= 0``
    becomes ``blocks[r, l // sparse_block] * sparse_block + l % sparse_block`` (-1 where that block
    is -1); negative entries stay -1. Returns int32 ``[R, k]``, in ``local``'s order."""
    l = local.to(torch.int64)
    slot = torch.where(l >= 0, l.div(sparse_block, rounding_mode="floor"), 0).clamp(max=max(blocks.shape[1] - 1, 0))
    block = blocks.to(torch.int64).gather(1, slot) if blocks.shape[1] else torch.full_like(l, -1)
    keep = (l >= 0) & (block >= 0)
    return torch.where(keep, block * sparse_block + l % sparse_block, -1).to(torch.int32)


def candidate_lens(blocks: torch.Tensor, row_lens: torch.Tensor, sparse_block: int) -> torch.Tensor:
    """Valid columns of each sparse logits row, int32 ``[R]``: the positions of ``blocks`` (int32
    ``[R, num_blocks]``, ascending, -1 after them) below the row's visible count ``row_lens`` (int
    ``[R]``). Under the blocks' contract these columns are a prefix of the row, so ``indexer_topk``
    takes them as ``row_starts = 0``, ``row_ends = candidate_lens(...)``."""
    first = blocks.to(torch.int64) * sparse_block
    inside = (row_lens.to(torch.int64)[:, None] - first).clamp(0, sparse_block)
    return torch.where(blocks >= 0, inside, 0).sum(1).to(torch.int32)


__all__ = [
    "LAYOUTS", "MAIN_LAYOUTS", "INDEX_LAYOUTS", "HEAD_DIM", "NOPE_DIM", "ROPE_DIM", "INDEX_DIM", "INDEX_TOKEN_BYTES",
    "INDEX_MXFP4_TOKEN_BYTES", "index_layout",
    "DS_MLA_TOKEN_BYTES", "ds_mla_page_bytes", "kv_cache_spec", "allocate_kv_cache",
    "ds_mla_views", "record_views", "encode_ds_mla", "decode_ds_mla", "encode_records", "decode_records",
    "convert_kv_cache", "write_kv", "read_kv", "pack_kv", "unpack_kv",
    "pack_index_keys", "unpack_index_keys", "index_key_views", "to_global_indices",
    "candidate_positions", "candidate_lens",
    "Layout", "pack_ue8m0_scales",
]
