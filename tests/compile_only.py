"""Compile every Triton kernel a conformance tier launches for a GPU target, on a machine
without one: ``python tests/compile_only.py cuda:sm90 [--all-layouts] [--asm DIR] [--ops A,B]
[--tuning SPEC] [--tier full]`` (``--tuning``: Triton tunables as ``DSV4OPS_TRITON_TUNING`` takes
them, e.g. a kernel family the defaults do not pick; ``--ops``: only those ops' cases; ``--tier``:
the conformance tier whose cases run, ``quick`` unless named).

The Triton interpreter (how CI runs the kernels) never runs Triton's code generator, so a kernel can
pass every CPU test and still fail to compile for a GPU (a variable with two shapes across
branches did, for paged_mqa_logits with next_n=6). Here Triton's driver is replaced by one that
reports the target and never launches: each launch compiles (frontend, the target's passes, ptxas
or the AMD linker bundled with Triton) and returns. Cases the Triton backend declines on that
platform (its capability checks, as in dispatch; the first implementation that accepts runs, so the
fp8 path is the platform's) are skipped. Prints the compiled cases per op and path and the compiled
kernels; exits 1 if any compile failed. ``--asm DIR`` writes each compiled variant's code (PTX or
AMDGCN without its debug information) as DIR/<kernel>.<hash>.s: two trees compiled into two
folders generate the same code where their file names agree (``diff <(ls A) <(ls B)``).
"""
import collections
import hashlib
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TARGETS = {**{f"cuda:sm{cc}": GPUTarget("cuda", cc, 32) for cc in (75, 80, 86, 89, 90, 100, 120)},
           **{f"rocm:{arch}": GPUTarget("hip", arch, 64) for arch in ("gfx90a", "gfx942", "gfx950")},
           **{f"rocm:{arch}": GPUTarget("hip", arch, 32) for arch in ("gfx1100", "gfx1151", "gfx1201")}}  # RDNA: wave32


class CompileOnlyDriver:
    """Reports ``target`` as the current device's and launches nothing."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True


def accepting(impls, plat, key):
    """The first of ``impls`` that serves the call on ``plat`` (None if all decline), its tensors
    taken for the platform's: the check that CPU tensors need the interpreter is satisfied by
    setting the variable for the evaluation only (the kernels were imported before, as compiled
    functions)."""
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        return next((impl for impl in impls if impl.decline_reason(plat, key) is None), None)
    finally:
        del os.environ["TRITON_INTERPRET"]


def code_only(asm: str) -> str:
    """PTX / AMDGCN up to the kernel's last return, without comments and the debug lines and labels
    that move with the source's line numbers."""
    lines = [re.sub(r"\.Ltmp\d+", ".Ltmp", line) for line in asm.splitlines()
             if not re.match(r"\s*(\.loc|\.file|//|;|\.Ltmp\d+:|\$L__tmp\d+:)", line)]
    ends = [i for i, line in enumerate(lines) if line.strip() in ("ret;", "s_endpgm")]
    return "\n".join(lines[:ends[-1] + 1] if ends else lines)


def main(argv) -> int:
    name, all_layouts = argv[0], "--all-layouts" in argv
    option = lambda flag: argv[argv.index(flag) + 1] if flag in argv else None
    asm_dir = Path(option("--asm")) if option("--asm") else None
    if option("--tuning"):
        os.environ["DSV4OPS_TRITON_TUNING"] = option("--tuning")
    driver.set_active(CompileOnlyDriver(TARGETS[name]))
    compiled = set()
    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.add(self.__name__)
        if asm_dir is not None:
            code = code_only(kernel.asm.get("ptx") or kernel.asm.get("amdgcn", ""))
            asm_dir.mkdir(parents=True, exist_ok=True)
            (asm_dir / f"{self.__name__}.{hashlib.sha1(code.encode()).hexdigest()[:12]}.s").write_text(code)
        return kernel

    JITFunction.run = compile_only

    import dsv4ops
    from dsv4ops import registry
    from dsv4ops.conformance.cases import cases
    from dsv4ops.ops import OP_NAMES, OPS

    failures = 0
    per_path = collections.Counter()
    triton = registry.get_backend("triton")
    for op in OP_NAMES:
        triton.implementations[op][0].fn          # import the kernels now, compiled (not interpreted)
    only = option("--ops").split(",") if option("--ops") else OP_NAMES
    with dsv4ops.simulate_platform(*name.split(":")) as plat:
        for op in only:
            for case in cases(op, option("--tier") or "quick"):
                if not all_layouts and "strided" in case.kwargs:
                    continue
                call = OPS[op].validate_call(**case.build("cpu", 0))
                impl = accepting(triton.implementations[op], plat, call.key)
                if impl is None:
                    continue                      # declined on that platform, as dispatch would
                try:
                    impl.bound(plat)(call.args)
                    per_path[op, impl.name] += 1
                except Exception as exc:          # a compile error names the kernel and the line
                    failures += 1
                    root = exc
                    while root.__cause__ or root.__context__:
                        root = root.__cause__ or root.__context__
                    print(f"FAILED {op} {case.id}: {type(exc).__name__}: {str(exc)[:2000]}\n  root cause: {root!r}")
    for (op, path), n in sorted(per_path.items()):
        print(f"cases {op} [{path}]: {n}")
    print("compiled for", name + ":", " ".join(sorted(compiled)))
    return 1 if failures or not compiled else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
