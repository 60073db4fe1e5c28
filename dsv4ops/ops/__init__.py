"""The op declarations, one module per op: its ``OpSpec`` (arguments, checks, fake outputs, reference,
conformance data, bench shapes) and the ``Op`` defined from it.

Every module of this package is an op: importing them all defines every op (an op added is a module
added). ``OPS`` is the registry's op table, ordered by the ops' sections in docs/ops.md.
"""
import importlib
import pkgutil

from .. import registry

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")       # its ``define(SPEC)`` enters the op table

# op name -> its defined Op (spec, typed args, public function, validation)
OPS = registry.op_table()
OP_NAMES = tuple(OPS)

__all__ = ["OPS", "OP_NAMES"]
