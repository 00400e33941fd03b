"""How every Shoal process logs: one line per record on stderr, the same in every process."""

from __future__ import annotations

import logging
import sys


def configure() -> None:
    """Shoal's own INFO lines (the access log among them); only warnings from libraries."""
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("shoal").setLevel(logging.INFO)
