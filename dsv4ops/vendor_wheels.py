"""Which FlashMLA / DeepGEMM wheel to install next to the installed torch.

Each tokenspeed build loads next to one torch only (a C++ extension), and the newest ones declare it
exactly (``torch==2.14.0``): installed by a plain ``pip install``, they replace the engine's torch. So the
``[flashmla]`` / ``[deepgemm]`` extras pin the builds that declare no torch (the ones run on the H100,
torch 2.11), and this table names the build for each torch; ``dsv4ops info`` prints the line for the
installed one, with ``--no-deps`` so that pip never touches torch."""
from __future__ import annotations

import torch

# torch major.minor -> distribution -> release (docs/contributing.md, "Supported and tested versions").
WHEELS = {
    "2.11": {"tokenspeed-deepgemm": "2.5.0.post20260604",      # loaded and ran on the H100 (2.11.0+cu130)
             "tokenspeed-flashmla": "1.0.0.post20260615"},
    "2.14": {"tokenspeed-deepgemm": "2.8.2.post20261020",      # declare torch==2.14.0; contract-tested only
             "tokenspeed-flashmla": "1.0.0.post20260924"},
}


def torch_minor(version: str) -> str:
    """'2.14.1+cu130' -> '2.14'."""
    return ".".join(version.split("+")[0].split(".")[:2])


_DISTS = ("tokenspeed-deepgemm", "tokenspeed-flashmla")


def install_line(torch_version: str = torch.__version__, dists: tuple[str, ...] = _DISTS) -> str | None:
    """The pip command that installs ``dists`` built for ``torch_version`` without changing torch; None
    when no build is known for it."""
    wheels = WHEELS.get(torch_minor(torch_version))
    return None if wheels is None else "pip install --no-deps " + " ".join(f"{d}=={wheels[d]}" for d in dists)


def install_hint(dists: tuple[str, ...] = _DISTS, torch_version: str = torch.__version__) -> str:
    """What to install for ``torch_version``: the pip line, or the torch versions that have builds."""
    minor = torch_minor(torch_version)
    line = install_line(torch_version, dists)
    if line is not None:
        return f"for torch {minor}: {line}"
    known = "; ".join(f"torch {t}: " + ", ".join(f"{d}=={WHEELS[t][d]}" for d in dists) for t in WHEELS)
    return f"no {' / '.join(dists)} build known for torch {minor} ({known})"
