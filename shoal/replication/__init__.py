"""Re-replication: versions written with fewer copies than the target get them back."""

from shoal.replication.restorer import Rereplicator, Tally

__all__ = ["Rereplicator", "Tally"]
