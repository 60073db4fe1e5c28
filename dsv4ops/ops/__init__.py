"""The op declarations, one module per op: its ``OpSpec`` (arguments, checks, fake outputs, reference,
conformance data, bench shapes) and the ``Op`` defined from it.

Every module of this package is an op: ``OPS`` finds them (an op added is a module added), ordered
by their section in docs/ops.md.
"""
import importlib
import pkgutil

_DEFINED = [importlib.import_module(f"{__name__}.{m.name}").OP for m in pkgutil.iter_modules(__path__)]

# op name -> its defined Op (spec, typed args, public function, validation)
OPS = {op.name: op for op in sorted(_DEFINED, key=lambda op: op.spec.section)}
OP_NAMES = tuple(OPS)

__all__ = ["OPS", "OP_NAMES"]
