"""S3 errors: one class per S3 error code, named as the code, with its HTTP status.

Handlers raise these; app.py turns them into S3's XML error body in one place. Errors of the
metadata and storage tiers know nothing of S3: `from_domain` maps them here, in one table.
"""

from __future__ import annotations

from typing import ClassVar

from shoal import metadata
from shoal.storage import DataUnavailable, ReplicasUnreachable, StorageUnavailable


class S3Error(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "InternalError"
    default_message: ClassVar[str] = "We encountered an internal error. Please try again."

    def __init_subclass__(
        cls, status: int = 400, message: str = "", code: str = "", **kwargs: object
    ) -> None:
        super().__init_subclass__(**kwargs)
        cls.status = status
        cls.code = code or cls.__name__
        cls.default_message = message or cls.__name__

    def __init__(self, message: str | None = None, **fields: str) -> None:
        super().__init__(message or self.default_message)
        self.message = message or self.default_message
        self.fields = fields  # extra elements of the <Error> body (BucketName, Key, ...)


class AccessControlListNotSupported(S3Error, message="The bucket does not allow ACLs"):
    pass


class AccessDenied(S3Error, status=403, message="Access Denied"):
    pass


class AccessForbidden(
    S3Error, status=403, message="CORSResponse: This CORS request is not allowed."
):
    pass


class AuthorizationHeaderMalformed(S3Error, message="The authorization header is malformed"):
    pass


class AuthorizationQueryParametersError(
    S3Error, message="Query-string authentication is malformed"
):
    pass


class BadDigest(S3Error, message="The Content-MD5 you specified did not match what we received."):
    pass


class BadRequest(S3Error, message="Bad Request"):
    pass


class BucketAlreadyExists(
    S3Error,
    status=409,
    message=(
        "The requested bucket name is not available. The bucket namespace is shared by all "
        "users of the system. Please select a different name and try again."
    ),
):
    pass


class BucketAlreadyOwnedByYou(
    S3Error,
    status=409,
    message=("Your previous request to create the named bucket succeeded and you already own it."),
):
    pass


class BucketNotEmpty(S3Error, status=409, message="The bucket you tried to delete is not empty"):
    pass


class EntityTooLarge(S3Error, message="Your proposed upload exceeds the maximum allowed size"):
    pass


class EntityTooSmall(
    S3Error, message="Your proposed upload is smaller than the minimum allowed size"
):
    pass


class IdMismatch(S3Error, message="Document ID does not match the specified configuration ID."):
    pass


class IncorrectNumberOfFilesInPostRequest(
    S3Error, message="POST requires exactly one file upload per request."
):
    pass


class IncompleteBody(
    S3Error,
    message=("You did not provide the number of bytes specified by the Content-Length HTTP header"),
):
    pass


class RequestTimeout(
    S3Error,
    message=(
        "Your socket connection to the server was not read from or written to within the "
        "timeout period."
    ),
):
    pass


class InternalError(
    S3Error, status=500, message=("We encountered an internal error. Please try again.")
):
    pass


class InvalidAccessKeyId(
    S3Error,
    status=403,
    message=("The AWS Access Key Id you provided does not exist in our records."),
):
    pass


class InvalidArgument(S3Error, message="Invalid Argument"):
    pass


class InvalidBucketName(S3Error, message="The specified bucket is not valid."):
    pass


class InvalidDigest(S3Error, message="The Content-MD5 you specified is not valid."):
    pass


class InvalidLocationConstraint(S3Error, message="The specified location-constraint is not valid"):
    pass


class InvalidPart(
    S3Error,
    message=(
        "One or more of the specified parts could not be found. The part may not have been "
        "uploaded, or the specified entity tag may not match the part's entity tag."
    ),
):
    pass


class InvalidPartNumber(S3Error, status=416, message="The requested partnumber is not satisfiable"):
    pass


class InvalidPartOrder(
    S3Error,
    message=("The list of parts was not in ascending order. Parts must be ordered by part number."),
):
    pass


class InvalidPolicyDocument(
    S3Error,
    message="The content of the form does not meet the conditions specified in the policy "
    "document.",
):
    pass


class InvalidRange(S3Error, status=416, message="The requested range is not satisfiable"):
    pass


class InvalidRequest(S3Error, message="Invalid Request"):
    pass


class InvalidS3DestinationBucket(S3Error, message="Invalid bucket ARN."):
    pass


class InvalidStorageClass(S3Error, message="The storage class you specified is not valid"):
    pass


class InvalidTag(S3Error, message="The TagSet you have provided is invalid"):
    pass


class KeyTooLongError(S3Error, message="Your key is too long"):
    pass


class MalformedACLError(
    S3Error,
    message=(
        "The XML you provided was not well-formed or did not validate against our published schema"
    ),
):
    pass


class MalformedXML(
    S3Error,
    message=(
        "The XML you provided was not well-formed or did not validate against our published schema"
    ),
):
    pass


class MalformedPOSTRequest(
    S3Error, message="The body of your POST request is not well-formed multipart/form-data."
):
    pass


class MaxPostPreDataLengthExceeded(
    S3Error, message="Your POST request fields preceding the upload file were too large."
):
    pass


class MaxMessageLengthExceeded(S3Error, message="Your request was too big."):
    pass


class MetadataTooLarge(
    S3Error, message="Your metadata headers exceed the maximum allowed metadata size."
):
    pass


class MethodNotAllowed(
    S3Error, status=405, message=("The specified method is not allowed against this resource.")
):
    pass


class MissingContentLength(
    S3Error, status=411, message=("You must provide the Content-Length HTTP header.")
):
    pass


class MissingSecurityHeader(S3Error, message="Your request is missing a required header."):
    pass


class NoSuchBucket(S3Error, status=404, message="The specified bucket does not exist"):
    pass


class NoSuchLifecycleConfiguration(
    S3Error, status=404, message="The lifecycle configuration does not exist"
):
    pass


class NoSuchCORSConfiguration(S3Error, status=404, message="The CORS configuration does not exist"):
    pass


class NoSuchConfiguration(
    S3Error, status=404, message="The specified configuration does not exist."
):
    pass


class NoSuchKey(S3Error, status=404, message="The specified key does not exist."):
    pass


class NoSuchTagSet(S3Error, status=404, message="The TagSet does not exist"):
    pass


class NoSuchUpload(
    S3Error,
    status=404,
    message=(
        "The specified upload does not exist. The upload ID may be invalid, or the upload "
        "may have been aborted or completed."
    ),
):
    pass


class NotImplementedByShoal(
    S3Error,
    status=501,
    code="NotImplemented",
    message="A header you provided implies functionality that is not implemented",
):
    pass


class PreconditionFailed(
    S3Error, status=412, message="At least one of the pre-conditions you specified did not hold"
):
    pass


class RequestTimeTooSkewed(
    S3Error,
    status=403,
    message=("The difference between the request time and the current time is too large."),
):
    pass


class ServiceUnavailable(S3Error, status=503, message="Service is unable to handle request."):
    pass


class SignatureDoesNotMatch(
    S3Error,
    status=403,
    message=(
        "The request signature we calculated does not match the signature you provided. "
        "Check your key and signing method."
    ),
):
    pass


class TooManyConfigurations(
    S3Error,
    message="You are attempting to create a new configuration but have already reached "
    "the 1,000-configuration limit.",
):
    pass


class UnexpectedContent(S3Error, message="This request does not support content"):
    pass


class XAmzContentSHA256Mismatch(
    S3Error,
    message=("The provided 'x-amz-content-sha256' header does not match what was computed."),
):
    pass


_DOMAIN: dict[type[Exception], type[S3Error]] = {
    metadata.BucketNotFound: NoSuchBucket,
    metadata.ObjectNotFound: NoSuchKey,
    metadata.UploadNotFound: NoSuchUpload,
    metadata.PreconditionFailed: PreconditionFailed,
    metadata.BucketAlreadyExists: BucketAlreadyExists,
    metadata.BucketAlreadyOwnedByYou: BucketAlreadyOwnedByYou,
    metadata.BucketNotEmpty: BucketNotEmpty,
    metadata.InvalidPart: InvalidPart,
    metadata.InvalidPartOrder: InvalidPartOrder,
    metadata.EntityTooSmall: EntityTooSmall,
    metadata.AccessKeyNotFound: InvalidAccessKeyId,
    metadata.AccountNotFound: AccessDenied,
    metadata.InvalidName: InvalidArgument,
    metadata.TooManyConfigurations: TooManyConfigurations,
    metadata.MetadataUnavailable: ServiceUnavailable,
    metadata.CommitUnknown: ServiceUnavailable,
    StorageUnavailable: ServiceUnavailable,
    ReplicasUnreachable: ServiceUnavailable,  # a DataUnavailable whose replicas may be whole
    DataUnavailable: InternalError,
}


def from_domain(error: Exception) -> S3Error | None:
    """The S3 error for an error of the metadata or storage tier, or None if it is a bug."""
    for kind in type(error).__mro__:
        if kind in _DOMAIN:
            s3_error = _DOMAIN[kind]
            # S3's own words for the codes that have them (clients show them as S3 wrote
            # them); the domain's, which say why, for a bare InvalidArgument.
            message = str(error) if s3_error is InvalidArgument else None
            return s3_error(message, **_fields(error))
    return None


def _fields(error: Exception) -> dict[str, str]:
    """The elements of S3's error body that a domain error has the facts for."""
    if isinstance(error, metadata.EntityTooSmall):
        return {
            "ProposedSize": str(error.size),
            "MinSizeAllowed": str(error.minimum),
            "PartNumber": str(error.part_number),
        }
    return {}


def by_code(code: str, message: str) -> S3Error:
    """An S3Error from a code named elsewhere (the SigV4 verifier)."""
    kind = next((k for k in S3Error.__subclasses__() if k.code == code), InvalidRequest)
    return kind(message)
