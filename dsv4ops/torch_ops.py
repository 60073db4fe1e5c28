"""The ops as PyTorch custom ops, ``torch.ops.dsv4ops.<op>``, for torch.compile and CUDA graphs.

Generated from each op's spec (``dsv4ops.opspec``): the schema, the mutation annotations and the
fake (meta) implementation all come from the one declaration, so the custom op takes every
argument the public function takes. Two forms per op, because a custom op may not return an alias
of an input: ``torch.ops.dsv4ops.<op>`` allocates and returns its outputs; ``<op>_out`` writes into
a required ``out`` and returns nothing (torch.compile functionalizes only such mutating custom ops;
the decode's lse therefore comes from the functional form).
``qnorm_rope_kv_insert`` has only the out form (its result is ``q`` itself otherwise), under its
own name. Scales cross the boundary as floats. Importing this module registers the ops; the real
implementation is the public ``dsv4ops.<op>`` (validation + cached selection).
"""
from __future__ import annotations

import torch

from .ops import OPS
from .opspec import Op

LIB = "dsv4ops"
_library = torch.library.Library(LIB, "FRAGMENT")


def _register(name: str, op: Op, out_form: bool) -> None:
    _library.define(name + op.schema(out_form))
    qualname = f"{LIB}::{name}"

    def run(*args, **kwargs):
        result = op.function(*args, **kwargs)
        return None if out_form else result

    def fake(*args, **kwargs):
        return None if out_form else op.spec.fake(op.bind(*args, **kwargs))

    torch.library.impl(qualname, "CompositeExplicitAutograd", lib=_library)(run)
    torch.library.register_fake(qualname, lib=_library)(fake)


for _op in OPS.values():
    if _op.spec.out_variant_only:
        _register(_op.name, _op, out_form=True)
    else:
        _register(_op.name, _op, out_form=False)
        if any(a.name == "out" for a in _op.spec.args):
            _register(_op.name + "_out", _op, out_form=True)
