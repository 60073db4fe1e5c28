"""Plain-text tables (no dependency), used by ``Decision.__str__`` and the CLI."""
from __future__ import annotations


def render_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    out = [line(header), line(tuple("-" * w for w in widths))]
    out += [line(r) for r in rows]
    return "\n".join(out)
