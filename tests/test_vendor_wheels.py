"""API-drift alarm from the vendor wheels' declared signatures, on a CPU machine: the DeepGEMM and FlashMLA
wheels import only next to a CUDA torch, but they ship their parameter lists as text (``deep_gemm/_C.pyi``,
``flash_mla/flash_mla_interface.py``). CI's drift step downloads the newest release and the pinned
previous generation of each (``pip download --no-deps``) into ``$DSV4OPS_VENDOR_WHEELS``; these tests read
the declarations from the wheel archives with ``ast`` (nothing is imported or installed), pick the API
generation the adapter would pick from them, and bind every call the adapter makes against that
generation's fake to the declared functions. Without the variable they skip."""
import ast
import inspect
import os
import pathlib
import zipfile

import pytest

from dsv4ops.backends.deepgemm import api_generation
from dsv4ops.backends.flashmla import V41_PAGES
from dsv4ops.backends.flashmla import api_generation as flashmla_generation

from test_vendor_contracts import RECORDERS, source_signature

PACKAGES = {"tokenspeed_deepgemm": "deep_gemm", "tokenspeed_flashmla": "flash_mla"}   # wheel name -> package


def wheel_declarations(wheel: pathlib.Path, package: str) -> dict[str, inspect.Signature]:
    """Top-level functions defined in ``<package>/*.py`` and ``*.pyi`` of a wheel, read without importing."""
    found = {}
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            folder, _, file = name.rpartition("/")
            if folder == package and file.endswith((".py", ".pyi")):
                tree = ast.parse(zf.read(name), filename=name)
                found.update({node.name: source_signature(node) for node in tree.body
                              if isinstance(node, ast.FunctionDef)})
    return found


def _recorders(package: str, declared: dict) -> list[str]:
    """The RECORDERS whose calls must fit this release: for DeepGEMM the generation the adapter picks
    from these declarations, plus the legacy names where the release still declares them."""
    if package == "flash_mla":
        generation = flashmla_generation(tuple(declared["flash_mla_with_kvcache"].parameters),
                                         "permute_q_b_proj" in declared)   # a function of the fused-kernel module
        return ["flashmla"] + (["flashmla-v41"] if generation in V41_PAGES else [])
    fp8_fp4 = declared.get("fp8_fp4_mqa_logits")
    generation = api_generation(None if fp8_fp4 is None else tuple(fp8_fp4.parameters), "fp8_mqa_logits" in declared)
    if generation is None:
        return []
    return [f"deepgemm-{generation}"] + (["deepgemm-legacy"] if generation != "legacy" and "fp8_mqa_logits" in declared
                                         else [])


def drift(monkeypatch, wheel: pathlib.Path) -> list[str]:
    """Every mismatch between the adapter's recorded calls (and the fakes' parameter lists) and the wheel."""
    package = PACKAGES[wheel.name.split("-")[0]]
    declared = wheel_declarations(wheel, package)
    recorders = _recorders(package, declared)
    if not recorders:
        return [f"{wheel.name}: declares an API generation the adapter does not know"]
    problems = []
    for recorder in recorders:
        with monkeypatch.context() as m:
            fakes, calls = RECORDERS[recorder](m)
        for path, fake in fakes.items():
            name = path.partition(":")[2]
            if name not in declared:
                problems.append(f"{wheel.name}: the adapter ({recorder}) calls {name}, which it does not declare")
                continue
            ours = [(p.name, p.kind, p.default is p.empty) for p in inspect.signature(fake).parameters.values()]
            theirs = [(p.name, p.kind, p.default is p.empty) for p in declared[name].parameters.values()]
            if ours != theirs:
                problems.append(f"{wheel.name}: {name} declares {theirs}, the {recorder} fake {ours}")
        for path, args, kwargs in calls:
            name = path.partition(":")[2]
            try:
                declared[name].bind(*args, **kwargs)
            except (KeyError, TypeError) as exc:
                problems.append(f"{wheel.name}: the adapter's call of {name} does not bind ({exc})")
    return sorted(set(problems))


def _downloaded() -> list[pathlib.Path]:
    folder = os.environ.get("DSV4OPS_VENDOR_WHEELS")
    if not folder:
        return []
    return sorted(w for w in pathlib.Path(folder).glob("*.whl") if w.name.split("-")[0] in PACKAGES)


@pytest.mark.parametrize("wheel", _downloaded() or [None], ids=lambda w: w.name if w else "none")
def test_adapter_calls_bind_to_wheel_declarations(monkeypatch, wheel):
    if wheel is None:
        pytest.skip("no vendor wheel in $DSV4OPS_VENDOR_WHEELS (CI's drift step downloads them)")
    assert drift(monkeypatch, wheel) == []


def test_flashmla_wheels_pick_their_generation():
    """FlashMLA wheels: 1.0.0.post20260924 (the fused-kernel module) gets the V4.1 calls checked too,
    the earlier ones the V4 calls only."""
    wheels = [w for w in _downloaded() if w.name.startswith("tokenspeed_flashmla")]
    if not wheels:
        pytest.skip("no FlashMLA wheel in $DSV4OPS_VENDOR_WHEELS (CI's drift step downloads them)")
    for wheel in wheels:
        v41 = wheel.name.split("-")[1] >= "1.0.0.post20260924"
        assert _recorders("flash_mla", wheel_declarations(wheel, "flash_mla")) == ["flashmla"] + ["flashmla-v41"] * v41


def _plant(wheel: pathlib.Path, folder: pathlib.Path, old: str, new: str) -> pathlib.Path:
    """A copy of ``wheel`` whose ``deep_gemm/_C.pyi`` has ``old`` replaced by ``new`` (once, checked)."""
    copy = folder / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(copy, "w") as dst:
        for name in src.namelist():
            if name.startswith("deep_gemm/") and name.endswith((".py", ".pyi")):
                text = src.read(name).decode()
                if name == "deep_gemm/_C.pyi":
                    assert text.count(old) == 1, f"{old!r} is not in {wheel.name}'s _C.pyi once"
                    text = text.replace(old, new)
                dst.writestr(name, text)
    return copy


@pytest.mark.parametrize("old, new, expected", [
    # the paged call's last two parameters dropped: the adapter's seven positional arguments no longer bind
    ("    max_context_len: int,\n    indices: Optional[torch.Tensor] = None\n", "",
     "call of fp8_fp4_paged_mqa_logits does not bind"),
    # one dropped: the seven still bind (max_context_len would land in `indices`), the parameter list differs
    ("    max_context_len: int,\n    indices", "    indices", "fp8_fp4_paged_mqa_logits declares"),
    # a parameter renamed: the calls still bind by position, the fake's parameter list no longer matches
    ("    cu_seq_len_k_end: torch.Tensor,\n    max_seqlen_k", "    cu_seq_len_k_stop: torch.Tensor,\n    max_seqlen_k",
     "fp8_fp4_mqa_logits declares"),
    # the generation marker changed: the adapter would not know the API (nothing is called)
    ("    max_seqlen_k: int,\n    schedule_meta", "    max_seqlen: int,\n    schedule_meta",
     "declares an API generation the adapter does not know"),
], ids=["two-dropped", "one-dropped", "renamed", "generation-marker"])
def test_drift_check_fails_on_a_planted_change(monkeypatch, tmp_path, old, new, expected):
    """The check above, on a copy of the newest DeepGEMM wheel whose _C.pyi has one signature changed."""
    newest = [w for w in _downloaded() if w.name.startswith("tokenspeed_deepgemm-2.8")]
    if not newest:
        pytest.skip("no DeepGEMM 2.8 wheel in $DSV4OPS_VENDOR_WHEELS (CI's drift step downloads it)")
    assert drift(monkeypatch, newest[-1]) == []
    problems = drift(monkeypatch, _plant(newest[-1], tmp_path, old, new))
    assert any(expected in p for p in problems), problems
