"""Exceptions raised by dsv4ops."""


class Dsv4opsError(Exception):
    """Base class of every error dsv4ops raises on purpose."""


class InputError(Dsv4opsError, ValueError):
    """An argument has the wrong shape, dtype, device, layout or value range.

    Raised before any kernel runs; caller buffers are untouched.
    """


class UnsupportedError(Dsv4opsError, RuntimeError):
    """The requested backend cannot serve these inputs on this platform."""


class ConfigError(Dsv4opsError, ValueError):
    """A malformed ``DSV4OPS_BACKEND`` (or other ``DSV4OPS_*``) setting."""


class VerificationError(Dsv4opsError, RuntimeError):
    """``DSV4OPS_VERIFY=...,raise``: a backend's result differed from the reference (docs/verify.md)."""
