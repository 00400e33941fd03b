"""The storage tier's errors as S3 sees them: what a retry may cure is 503, not 500."""

from __future__ import annotations

from shoal.s3.errors import InternalError, ServiceUnavailable, from_domain
from shoal.storage import DataUnavailable, ReplicasUnreachable, StorageUnavailable


def test_unreachable_replicas_are_a_503_and_lost_blocks_a_500() -> None:
    assert isinstance(from_domain(ReplicasUnreachable("x")), ServiceUnavailable)
    assert isinstance(from_domain(StorageUnavailable("x")), ServiceUnavailable)
    assert isinstance(from_domain(DataUnavailable("x")), InternalError)
