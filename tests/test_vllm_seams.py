"""The vLLM plugin's drift alarm (dsv4ops/integrations/vllm/seams.py): every seam in the newest
CUDA wheel (DSV4OPS_VLLM_WHEEL) and in the installed vLLM, and a planted change caught by name."""
import os

import pytest

from dsv4ops.integrations.vllm import seams


def test_wheel_seams():
    wheel = os.environ.get("DSV4OPS_VLLM_WHEEL")
    if not wheel:
        pytest.skip("DSV4OPS_VLLM_WHEEL is not set (CI sets it to the newest vllm wheel)")
    assert seams.check_wheel(wheel) == []


def test_installed_seams():
    pytest.importorskip("vllm.platforms", reason="vLLM is not installed (CI's vLLM lane runs this)")
    assert seams.check_installed() == []


def _sources() -> dict[str, str]:
    """Small module texts that satisfy every seam."""
    files: dict[str, list[str]] = {}
    for seam in seams.SEAMS:
        lines = files.setdefault(seams._module_files(seam.module)[0], [])
        owner, _, leaf = seam.qualname.rpartition(".")
        if seam.kind == seams.CLASS:
            lines.append(f"class {leaf}:\n" + "".join(f"    def {m}(self): ...\n" for m in seam.members))
        elif seam.kind == seams.ATTRIBUTE:
            lines.append(f"{leaf} = None\n" if not owner else f"class {owner}:\n    {leaf} = []\n")
        else:
            body = f"def {leaf}({', '.join(seam.params) or '*args'}): ...\n"
            lines.append(f"class {owner}:\n    " + body if owner else body)
    merged = {}
    for path, parts in files.items():      # one class per name: merge the members of repeated classes
        classes: dict[str, list[str]] = {}
        rest = []
        for part in parts:
            if part.startswith("class "):
                head, _, body = part.partition("\n")
                classes.setdefault(head, []).append(body)
            else:
                rest.append(part)
        merged[path] = "".join(rest) + "".join(head + "\n" + "".join(b) for head, b in classes.items())
    return merged


def test_planted_sources_pass():
    assert seams.check_source(_sources()) == []


@pytest.mark.parametrize("seam_name, change", [
    ("attention_step", lambda t: t.replace("def forward_mqa(self, q, kv, positions, output)", "def forward_mqa(self, q, kv, output)")),
    ("o_proj_step", lambda t: t.replace("def _o_proj(", "def _o_projection(")),
    ("compressor", lambda t: t.replace("kv_score, positions, rotary_emb", "kv_score, rotary_emb")),
    ("gpu_attention_class", lambda t: t.replace("_select_dsv4_attn_cls", "_pick_dsv4_attn_cls")),
])
def test_planted_change_names_the_seam(seam_name, change):
    files = _sources()
    seam = seams.BY_NAME[seam_name]
    path = seams._module_files(seam.module)[0]
    changed = change(files[path])
    assert changed != files[path]
    problems = seams.check_source({**files, path: changed})
    assert any(p.startswith(f"{seam_name}:") for p in problems)
