"""The S3 gateway."""
