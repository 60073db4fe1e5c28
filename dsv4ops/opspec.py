"""One declaration per op.

An op module declares an ``OpSpec``: its arguments (name, type, default, keyword-only, written,
doc), its outputs, its checks, its fake (shape-only) outputs, where its reference lives, its
conformance data and its bench shapes. ``define(spec)`` derives from it everything else: the typed
argument tuple handed to implementations, the public function (a real Python signature, built the
way ``dataclasses`` builds ``__init__``, with the arguments documented), validation (including
every overlap check between a written tensor and the other tensor arguments), the dispatch key that
capability checks see, and the ``torch.library`` schema. Adding an argument is a one-place change.
"""
from __future__ import annotations

import collections
import importlib
import inspect
import keyword
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

import torch

from . import registry, selection, tensor_guard
from .checker import Checker
from .errors import InputError
from .formats import ALL_LAYOUTS, Layout
from .platform import thread_state

REQUIRED = inspect.Parameter.empty
Scale = Union[float, torch.Tensor]          # a float, or a 1-element fp32 tensor read on the device

# argument type -> torch.library schema type (scales cross the custom-op boundary as floats)
_SCHEMA_TYPES = {
    torch.Tensor: "Tensor", Optional[torch.Tensor]: "Tensor?", int: "int", Optional[int]: "int?",
    float: "float", bool: "bool", str: "str", Layout: "str", Optional[Layout]: "str?", torch.dtype: "ScalarType",
    Scale: "float",
}


@dataclass(frozen=True)
class Arg:
    """One argument. ``mutated``: written in place (a cache, an ``out`` buffer): validation refuses
    it overlapping itself or any other tensor argument, except being the very same view as one named
    in ``same_view_ok`` (an in-place form the contract allows). ``doc``: dtype, shape and meaning, as
    ``help(dsv4ops.<op>)`` shows it. ``none_means``: another argument whose value a None here stands
    for (``extra_layout=None`` is ``layout``); the op's check resolves it, and so does the fast path."""

    name: str
    type: Any
    default: Any = REQUIRED
    keyword_only: bool = False
    mutated: bool = False
    doc: str = ""
    same_view_ok: tuple[str, ...] = ()
    none_means: str = ""

    @property
    def is_tensor(self) -> bool:
        return self.type in (torch.Tensor, Optional[torch.Tensor])


@dataclass(frozen=True)
class Conformance:
    """What the conformance suite, verification, ``dsv4ops info`` and the error tests know of an op.

    - ``inputs(device, gen, **params)``: keyword arguments of a call, fresh random values per
      ``torch.Generator`` (never zeros), with the op's poisons (NaN rows nothing selects, ...).
    - ``cases(tier)``: builder parameters of each case of tier ``"quick"`` (CPU-sized) or ``"full"``.
    - ``typical``: builder parameters of a small V4-Flash TP1 call (what ``dsv4ops info`` explains).
    - ``compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> tolerance.Verdict``:
      the comparison rule (``params``: the case's builder parameters, ``{}`` under verification).
    - ``strides``: tensor argument -> the layouts the contract accepts besides contiguous
      (``"sliced"``, ``"transposed"``, ``"expanded"``; the first is the quick tier's);
      ``stride_bases``: tier -> builder parameters the stride / alias family is generated on.
    - ``error_base``: builder parameters of a valid call; ``errors``: ``(argument, change)`` pairs,
      ``change(kwargs)`` making that call wrong in that argument (``sampling.set_args`` / ``change``).
    - ``unspecified(kwargs)``: for ops whose contract leaves part of a result unspecified, a bool
      mask of those elements of the (first) result; ``check --repeat`` compares only the rest.
    """

    inputs: Callable[..., dict]
    cases: Callable[[str], Iterable[dict]]
    typical: dict
    compare: Callable[..., Any]
    strides: dict[str, tuple[str, ...]]
    stride_bases: dict[str, tuple[dict, ...]]
    error_base: dict
    errors: tuple[tuple[str, Callable[[dict], None]], ...]
    unspecified: Callable[[dict], Any] | None = None


@dataclass(frozen=True)
class BenchShapes:
    """What ``dsv4ops bench`` knows of an op: ``cost(kwargs) -> (bytes, flops)`` a kernel must move /
    do at least; ``tiny``: builder parameters of a smoke-sized call (``bench --tiny``, the overhead
    measurement); ``production`` / ``sweep``: builder parameters of the shape sets of those names;
    ``matrix``: the tensor-core rate its flops count against (``"fp8"`` or ``"bf16"``)."""

    cost: Callable[[dict], tuple[int, int]]
    tiny: dict
    production: tuple[dict, ...]
    sweep: tuple[dict, ...] = ()
    matrix: str = "bf16"


@dataclass(frozen=True)
class OpSpec:
    """An op: ``section`` of docs/ops.md that is its contract; ``check(c, a)`` validates the typed
    args ``a`` with the ``Checker`` ``c`` (raising ``InputError``) and returns them normalized (a
    layout name becomes its ``Layout``); ``fake(a)`` returns outputs of the right shape and dtype
    without computing; ``reference``: ``"module:function"`` of its PyTorch reference (typed args).
    ``outputs`` is the torch.library return type; ``out_variant_only`` marks ops whose result may
    alias an input (only their ``out=`` form exists as a torch op). ``leading``: the tensor
    arguments whose dim 0 is the call's leading size (tokens per step at most), none when the op
    has no such size: a call cut to its first ``n`` rows slices exactly these (``at_size``), which
    is how warm-up runs an implementation whose JIT compiles per leading size at every size.
    ``composes``: the ops whose results define this op's (docs/ops.md: ``mqa_topk`` is
    ``indexer_topk(mqa_logits(...))``); its module may build on theirs, and no op module imports
    another's otherwise (tests/test_import_graph.py)."""

    name: str
    section: int
    doc: str
    args: tuple[Arg, ...]
    outputs: str
    check: Callable[[Checker, Any], Any]
    fake: Callable[[Any], Any]
    reference: str
    conformance: Conformance
    bench: BenchShapes
    out_variant_only: bool = False
    leading: tuple[str, ...] = ()
    composes: tuple[str, ...] = ()

    def at_size(self, args, n: int):
        """The typed ``args`` cut to their first ``n`` rows: the ``leading`` tensors sliced on dim 0
        (views of the same storage; an absent optional one stays None)."""
        return args._replace(**{name: getattr(args, name)[:n] for name in self.leading
                                if getattr(args, name) is not None})

    def reference_function(self, name: str = "") -> Callable[[Any], Any]:
        """The reference (typed args -> result), or the function ``name`` of its module
        (``output_magnitude``, say), imported when first asked."""
        module, _, function = self.reference.partition(":")
        return getattr(importlib.import_module(module), name or function)

    @property
    def written(self) -> tuple[Arg, ...]:
        """The tensor arguments the op writes (caches, ``out``)."""
        return tuple(a for a in self.args if a.is_tensor and a.mutated)


@dataclass(frozen=True)
class TensorMeta:
    """What a capability check may know of a tensor: no leading (token / batch) size, no data."""

    dtype: torch.dtype
    device: torch.device
    shape: tuple                 # shape[0] is None: decisions must not depend on the token count

    def dim(self) -> int:
        return len(self.shape)


class DispatchKey:
    """The view of a call that capability checks receive: tensors as ``TensorMeta``, every other
    argument except float values (scales, eps), ``device`` and ``size_class`` (the bit length of the
    leading size). Reading anything else raises, so a check cannot depend on what decisions are not
    cached by."""

    __slots__ = ("op", "device", "size_class", "_fields")

    def __init__(self, op: str, args, device: torch.device):
        fields = {}
        for name, value in zip(args._fields, args):
            if isinstance(value, torch.Tensor):
                fields[name] = TensorMeta(value.dtype, value.device, (None, *value.shape[1:]))
            elif not isinstance(value, float):
                fields[name] = value
        first = next((v for v in args if isinstance(v, torch.Tensor) and v.dim()), None)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "size_class", int(first.shape[0]).bit_length() if first is not None else 0)
        object.__setattr__(self, "_fields", fields)

    @classmethod
    def derived(cls, op: str, fields: dict, device: torch.device, size_class: int) -> "DispatchKey":
        """The key of a call made of another call's arguments (an op one implementation runs inside
        another): ``fields`` as ``__init__`` builds them (every argument; TensorMeta for tensors)."""
        key = object.__new__(cls)
        for name, value in (("op", op), ("device", device), ("size_class", size_class), ("_fields", dict(fields))):
            object.__setattr__(key, name, value)
        return key

    def __getattr__(self, name: str):
        fields = object.__getattribute__(self, "_fields")
        if name in fields:
            return fields[name]
        raise AttributeError(f"{name!r} is not part of {self.op}'s dispatch key: capability checks may read "
                             f"only {sorted(fields)}, device and size_class")

    def get(self, name: str, default=None):
        return object.__getattribute__(self, "_fields").get(name, default)

    def items(self):
        """(name, value) of every field, in argument order (TensorMeta for tensors)."""
        return object.__getattribute__(self, "_fields").items()

    def __setattr__(self, name, value):
        raise AttributeError("a DispatchKey is read-only")


@dataclass(frozen=True)
class OpCall:
    """A validated call: the typed args, the device they live on, and the dispatch key."""

    op: str
    args: Any
    device: torch.device
    key: DispatchKey = field(repr=False)


class Op:
    """An op defined from its spec: ``op(...)`` is the public function's body, ``op.validate``,
    ``op.bind`` (typed args from the public signature), ``op.schema`` (torch.library)."""

    def __init__(self, spec: OpSpec):
        self.spec = spec
        self.name = spec.name
        self.Args = collections.namedtuple(_camel(spec.name) + "Args", [a.name for a in spec.args])
        self.Args.__doc__ = f"Typed arguments of {spec.name} (what every implementation receives)."
        self.signature = inspect.Signature(_parameters(spec.args))
        self.bind = _generate(spec, "bind", "    return Args({values})", {"Args": self.Args})
        self.structure, self.guarded = _over_typed_args(spec)
        self.function = _generate(spec, spec.name, _FAST_PATH, {
            "Args": self.Args, "op": self, "fast": selection.fast_table(spec.name), "dispatch": selection.dispatch,
            "recent": selection.recent_structures(spec.name), "RECENT": selection.RECENT,
            "thread": thread_state, "Tensor": torch.Tensor, "layout_of": ALL_LAYOUTS,
            "new": tuple.__new__, **_absent_names(spec)}, with_backend=True)
        self.function.__doc__ = _docstring(spec)
        self.function.__module__ = "dsv4ops"

    def validate(self, args) -> OpCall:
        """Check typed args (raises InputError naming the argument); the call to dispatch."""
        checker = Checker(self.name, args)
        args = self.spec.check(checker, args)
        for arg in self.spec.written:
            checker.disjoint(args, arg.name, same_ok=arg.same_view_ok)
        device = checker.device if checker.device is not None else torch.device("cpu")
        return OpCall(self.name, args, device, DispatchKey(self.name, args, device))

    def validate_call(self, *args, **kwargs) -> OpCall:
        """``validate`` from the public function's arguments (``explain``, ``prepare``)."""
        try:
            typed = self.bind(*args, **kwargs)
        except TypeError as exc:
            raise InputError(f"{self.name}: {exc}") from None
        return self.validate(typed)

    def reference(self, *args, **kwargs):
        """The reference's result on a validated call (the public function's arguments), without
        dispatch: what comparison rules compute with."""
        return self.spec.reference_function()(self.validate_call(*args, **kwargs).args)

    def schema(self, out_form: bool = False) -> str:
        """The torch.library schema: functional (``out`` excluded) or the out form."""
        return _schema(self.spec, with_out=out_form)

    def __repr__(self) -> str:
        return f"<dsv4ops op {self.name}{self.signature}>"


def define(spec: OpSpec) -> Op:
    """Derive the op from its spec and make it known to the registry (``DSV4OPS_BACKEND`` names it)."""
    op = Op(spec)
    registry.register_op(op)
    return op


def _docstring(spec: OpSpec) -> str:
    """The op's doc followed by one line per argument (what ``help(dsv4ops.<op>)`` shows)."""
    lines = [inspect.cleandoc(spec.doc), "", "Args:"]
    for a in spec.args:
        written = " Written in place." if a.mutated else ""
        lines.append(f"    {a.name}: {a.doc}{written}")
    lines += ["    backend: run this backend (None: DSV4OPS_BACKEND, then priority).", "",
              f"Contract: docs/ops.md §{spec.section}."]
    return "\n".join(lines)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _parameters(args, with_backend: bool = False) -> list[inspect.Parameter]:
    params = []
    for a in args:
        kind = inspect.Parameter.KEYWORD_ONLY if a.keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        params.append(inspect.Parameter(a.name, kind, default=a.default, annotation=a.type))
    if with_backend:
        params.append(inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Optional[str]))
    return params


# The public function's body. A call whose arguments pass the compiled guard of one of the op's
# recently dispatched structures runs that structure's implementation at once; otherwise its
# structure key is looked up in the op's fast table (filled by selection.dispatch, a hit becomes
# recent); anything else (a new structure, an argument that has none) goes through validation and
# selection. ``scalars``: the non-tensor part of the key, which the guards do not see.
_FAST_PATH = """\
    run = None
    try:
        scalars = (backend, thread.simulated, {scalars})
        for guard, seen, hit in recent:
            if seen == scalars and guard({guarded}):
                run = hit
                break
        else:
            key = (scalars, {structure})
            entry = fast.get(key)
            if entry is not None:
                run = entry[2]
                if entry[0] is not None:
                    recent.insert(0, entry)
                    del recent[RECENT:]
    except (TypeError, AttributeError, RuntimeError):
        key = None
    if run is None:
        return dispatch(op, Args({values}), backend, key)
    return run(new(Args, ({normalized},)))"""


def _meta(r: str) -> str:
    return f"{r}.dtype, {r}.get_device(), {r}.shape, {r}.stride()"


def _key_terms(spec: OpSpec, ref: Callable[[str], str]) -> tuple[list[str], list[str], list[str]]:
    """A call's structure, as three lists of expressions over the arguments: ``scalars`` (every
    non-tensor value with its type, and which optional tensors are present), ``structure`` (per tensor
    its dtype, device index (-1 for the CPU and meta; a process has one accelerator type), shape and
    strides) and ``guarded`` (the tensors a compiled guard checks instead of ``structure``; an absent
    one at position i becomes ``absent{i}``, ``tensor_guard.absent(i)``)."""
    scalars, structure, guarded = [], [], []
    for a in spec.args:
        r = ref(a.name)
        if a.type is torch.Tensor:
            structure.append(_meta(r))
            guarded.append(r)
        elif a.type == Optional[torch.Tensor]:
            scalars.append(f"{r}.__class__")
            structure.append(f"None if {r} is None else ({_meta(r)})")
            guarded.append(f"absent{len(guarded)} if {r} is None else {r}")
        elif a.type == Scale:
            scalars.append(f"{r}.__class__, None if isinstance({r}, Tensor) else {r}")
            structure.append(f"({_meta(r)}) if isinstance({r}, Tensor) else None")
            guarded.append(f"{r} if isinstance({r}, Tensor) else absent{len(guarded)}")
        elif a.type in (int, float, bool, Optional[int]):
            scalars.append(f"{r}.__class__, {r}")         # 16.0 == 16 and 0 == False, but not valid alike
        else:
            scalars.append(r)
    assert any(a.type is torch.Tensor for a in spec.args), \
        f"{spec.name}: an op needs a required tensor argument (it fixes the device)"
    return scalars, structure, guarded


def _absent_names(spec: OpSpec) -> dict[str, torch.Tensor]:
    return {f"absent{i}": tensor_guard.absent(i) for i in range(len(spec.args))}


def _over_typed_args(spec: OpSpec) -> tuple[Callable, Callable]:
    """``structure(a)``: the structure key of typed args ``a`` without the backend (what prepared
    calls compare); ``guarded(a)``: the tensors a compiled guard of that structure checks."""
    scalars, structure, guarded = _key_terms(spec, lambda n: "a." + n)
    source = (f"def structure(a):\n    return (({''.join(t + ', ' for t in scalars)}), {', '.join(structure)})\n"
              f"def guarded(a):\n    return ({', '.join(guarded)},)\n")
    namespace = {"Tensor": torch.Tensor, **_absent_names(spec)}
    exec(compile(source, f"<dsv4ops op {spec.name} structure>", "exec"), namespace)
    return namespace["structure"], namespace["guarded"]


def _generate(spec: OpSpec, name: str, body: str, env: dict, with_backend: bool = False) -> Callable:
    """A function with the spec's exact signature (no ``*args`` re-binding on the hot path)."""
    params, defaults, star = [], {}, False
    for a in spec.args:
        assert a.name.isidentifier() and not keyword.iskeyword(a.name), a.name
        if a.keyword_only and not star:
            params.append("*")
            star = True
        if a.default is REQUIRED:
            params.append(a.name)
        else:
            defaults[f"_default_{a.name}"] = a.default
            params.append(f"{a.name}=_default_{a.name}")
    if with_backend:
        params += ([] if star else ["*"]) + ["backend=None"]
    values = ", ".join(a.name for a in spec.args)
    normalized = ", ".join(_normalized(a) for a in spec.args)
    scalars, structure, guarded = (", ".join(terms) for terms in _key_terms(spec, str))
    body = body.format(values=values, normalized=normalized, scalars=scalars, structure=structure, guarded=guarded)
    source = f"def {name}({', '.join(params)}):\n{body}\n"
    namespace = {**env, **defaults}
    exec(compile(source, f"<dsv4ops op {spec.name}>", "exec"), namespace)
    fn = namespace[name]
    fn.__signature__ = inspect.Signature(_parameters(spec.args, with_backend))
    return fn


def _normalized(a: Arg) -> str:
    """The expression the fast path passes for ``a``: None resolved through ``none_means``, a layout
    name turned into its ``Layout`` (what the op's check returns for a validated call)."""
    value = f"({a.name} if {a.name} is not None else {a.none_means})" if a.none_means else a.name
    return f"layout_of.get({value}, {value})" if a.type in (Layout, Optional[Layout]) else value


def _schema(spec: OpSpec, with_out: bool) -> str:
    """Functional form (``out`` left out, outputs returned) or out form (``out`` required, returns
    nothing): custom ops may not return an alias of an input, and torch.compile functionalizes
    mutating custom ops only when they return nothing, so the out form returns ``()``."""
    parts, star, alias_sets = [], False, iter("abcdefgh")
    for a in spec.args:
        if a.name == "out" and not with_out:
            continue
        if a.keyword_only and not star:
            parts.append("*")
            star = True
        kind = _SCHEMA_TYPES[a.type]
        default = "" if a.default is REQUIRED else "=" + _schema_default(a.default)
        if a.mutated:
            kind = kind.replace("Tensor", f"Tensor({next(alias_sets)}!)")
        if a.name == "out":
            kind, default = kind.rstrip("?"), ""
        parts.append(f"{kind} {a.name}{default}")
    return f"({', '.join(parts)}) -> {'()' if with_out else spec.outputs}"


def _schema_default(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, torch.dtype):
        return str({torch.float32: 6, torch.bfloat16: 15}[value])      # c10::ScalarType codes
    if isinstance(value, Layout):
        return f'"{value.name}"'
    return repr(value)
