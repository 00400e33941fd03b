"""Quantities as the CLI's tables show them to people."""

from __future__ import annotations

BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def byte_size(count: int) -> str:
    """`count` bytes in the largest binary unit under 1024 of it (TiB at most): 512 B, 1.5 GiB."""
    size = float(count)
    for unit in BYTE_UNITS[:-1]:
        if size < 1024:
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} {BYTE_UNITS[-1]}"
