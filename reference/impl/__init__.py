"""The reference implementations, one module per op: ``<op>(a)`` on the op's typed args (each op's
spec names its function in ``OpSpec.reference``)."""
