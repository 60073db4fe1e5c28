"""Worked examples built only from dsv4ops calls (``python -m dsv4ops.examples.decode_step``,
``python -m dsv4ops.examples.layer``)."""
