"""Garbage collection: the rules of reclamation and the collector that applies them."""

from shoal.gc.collector import Collector, connections_needed
from shoal.gc.rules import DEFAULT_LEEWAY, blocks_of, may_remove, parse_leeway

__all__ = [
    "DEFAULT_LEEWAY",
    "Collector",
    "blocks_of",
    "connections_needed",
    "may_remove",
    "parse_leeway",
]
