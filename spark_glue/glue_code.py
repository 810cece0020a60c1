"""The `GlueCode` custom resource: ships the Glue jobs' shared code with every deploy.

CloudFormation calls this function (template.yaml, `GlueCodeFunction`) when the stack creates
the resource and whenever its properties change. Its code is this folder (`CodeUri:
spark_glue/`), so it holds the `delayq_reports` package: on Create and Update it builds the
reproducible zip (`glue_zip.archive`) and puts it to ``s3://<Bucket>/<Key>``, the object the
jobs load with ``--extra-py-files``. The `CodeVersion` property is the function's published
version: new code publishes a new version, which changes the property, which makes
CloudFormation send an Update, so the object always holds the package that was deployed.

Delete does nothing: the object is in the analytics bucket, which is versioned and outlives
the jobs (exports and reports are kept when the stack goes), and a Delete also comes when a
failed create is rolled back or the resource is replaced, when removing the zip could leave
jobs without their code.

Every request is answered (PUT of the response to the pre-signed `ResponseURL`), FAILED with
the reason when something went wrong, so that CloudFormation never waits for an answer.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from glue_zip import archive

log = logging.getLogger(__name__)
log.setLevel(logging.INFO)

SUCCESS = "SUCCESS"
FAILED = "FAILED"
# CloudFormation refuses a response body over 4,096 bytes: the reason is cut well below that.
MAX_REASON_CHARS = 1000
RESPONSE_TIMEOUT_SECONDS = 30

# (ResponseURL, body): sends one response to CloudFormation.
Responder = Callable[[str, bytes], None]
# () -> (zip bytes, names in it)
Archiver = Callable[[], tuple[bytes, list[str]]]


class GlueCodeError(Exception):
    """A request this resource cannot carry out (missing or malformed properties)."""


def on_event(
    event: Mapping[str, Any],
    *,
    s3: Any,
    respond: Responder,
    build: Archiver = archive,
) -> dict[str, Any]:
    """Carry out one CloudFormation request and answer it; returns the response sent."""
    request = str(event.get("RequestType", ""))
    physical_id = str(event.get("PhysicalResourceId") or "")
    data: dict[str, Any] = {}
    try:
        bucket, key = _location(event.get("ResourceProperties") or {})
        physical_id = physical_id if request == "Delete" else f"s3://{bucket}/{key}"
        if request in ("Create", "Update"):
            data = _put(s3, bucket, key, build)
        elif request != "Delete":
            raise GlueCodeError(f"unknown RequestType {request!r}")
        status, reason = SUCCESS, ""
    except Exception as e:
        log.exception("GlueCode %s failed", request)
        status, reason = FAILED, f"{type(e).__name__}: {e}"[:MAX_REASON_CHARS]
    response = {
        "Status": status,
        "Reason": reason or f"{request} done",
        # Required in every response; a Create that failed before it had one names the
        # logical resource (CloudFormation sends no Delete for a failed Create's id anyway).
        "PhysicalResourceId": physical_id or str(event.get("LogicalResourceId") or "GlueCode"),
        "StackId": event.get("StackId"),
        "RequestId": event.get("RequestId"),
        "LogicalResourceId": event.get("LogicalResourceId"),
        "NoEcho": False,
        "Data": data,
    }
    respond(str(event["ResponseURL"]), json.dumps(response).encode())
    return response


def _location(properties: Mapping[str, Any]) -> tuple[str, str]:
    bucket, key = properties.get("Bucket"), properties.get("Key")
    if not isinstance(bucket, str) or not bucket or not isinstance(key, str) or not key:
        raise GlueCodeError("the properties Bucket and Key are required")
    return bucket, key


def _put(s3: Any, bucket: str, key: str, build: Archiver) -> dict[str, Any]:
    body, names = build()
    put = s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/zip")
    log.info("put s3://%s/%s: %d bytes, %d modules", bucket, key, len(body), len(names))
    return {"Modules": len(names), "Bytes": len(body), "VersionId": put.get("VersionId", "")}


def send_response(url: str, body: bytes) -> None:
    """PUT the response to CloudFormation's pre-signed URL (cfn-response's request)."""
    if not url.startswith("https://"):
        raise GlueCodeError(f"ResponseURL is not https: {url[:40]!r}")
    request = urllib.request.Request(  # noqa: S310 (https only, checked above)
        url,
        data=body,
        method="PUT",
        headers={"Content-Type": "", "Content-Length": str(len(body))},
    )
    with urllib.request.urlopen(request, timeout=RESPONSE_TIMEOUT_SECONDS) as answer:  # noqa: S310
        log.info("response sent: HTTP %s", answer.status)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point: the S3 client and the responder are the real ones."""
    import boto3  # noqa: PLC0415 (the Lambda runtime's boto3; tests inject their client)

    return on_event(event, s3=boto3.client("s3"), respond=send_response)
