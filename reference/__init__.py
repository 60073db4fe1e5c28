"""The PyTorch references: one function per op, the definition of correct for every backend.

They compute in fp32 (fp64 for the einsum) from exactly the bytes a kernel would read, round only
where docs/ops.md says, and run on any device. Registered as the backend ``reference`` (lowest
priority) from each op's ``OpSpec.reference``. ``dsv4ops.reference.<op>(...)`` takes the public
signature (validated, then the reference runs); the implementations in ``dsv4ops.reference.impl``
take the typed args.
"""
from dsv4ops import registry
from dsv4ops.ops import OPS
from dsv4ops.platform import VENDORS

BACKEND = registry.register_backend(registry.Backend("reference", VENDORS,
                                                     description="PyTorch references (any device)"))


def _public(op):
    def reference(*args, **kwargs):
        return op.function(*args, backend="reference", **kwargs)
    reference.__name__ = reference.__qualname__ = op.name
    reference.__signature__ = op.signature
    reference.__doc__ = f"The reference {op.name} (public signature; validated like dsv4ops.{op.name})."
    return reference


for _name, _op in OPS.items():
    BACKEND.implements(_name, _op.spec.reference)
    globals()[_name] = _public(_op)
del _name, _op

__all__ = list(OPS)
