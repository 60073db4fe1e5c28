"""In-tree vendor backends, one sub-package each. Each registers through the ``dsv4ops.backends``
entry-point group and imports its vendor library only when probed or called.

The API names both ``dsv4ops.backends()`` (list backends) and ``dsv4ops.backends.<vendor>``
(sub-packages), so this package is callable: calling it returns ``registry.backends()``.
"""
import sys
import types

from dsv4ops.registry import BackendInfo, backends as _list_backends


class _CallablePackage(types.ModuleType):
    def __call__(self) -> list[BackendInfo]:
        """Every registered backend: name, availability (and why not), platforms, ops."""
        return _list_backends()


sys.modules[__name__].__class__ = _CallablePackage
