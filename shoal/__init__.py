"""Shoal: an S3-compatible object store with its metadata in PostgreSQL."""

__version__ = "0.1.0"
