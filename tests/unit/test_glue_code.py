"""The GlueCode custom resource (spark_glue/glue_code.py): what it puts, what it answers."""

from __future__ import annotations

import json
import urllib.request
import zipfile
from collections.abc import Iterator
from io import BytesIO
from typing import Any

import boto3
import glue_code
import glue_zip
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

BUCKET = "delayq-test-analyticsbucket-1x2y3z"
KEY = "glue/delayq_reports.zip"
FUNCTION = "arn:aws:lambda:us-east-1:123456789012:function:delayq-GlueCodeFunction"
URL = "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/signed?x=1"


def request(kind: str, **extra: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "RequestType": kind,
        "ServiceToken": FUNCTION,
        "ResponseURL": URL,
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/delayq/1a2b",
        "RequestId": "5d478078-13e9-baf0-464a-7ef285ecc786",
        "LogicalResourceId": "GlueCode",
        "ResourceType": "AWS::CloudFormation::CustomResource",
        "ResourceProperties": {
            "ServiceToken": FUNCTION,
            "Bucket": BUCKET,
            "Key": KEY,
            "CodeVersion": f"{FUNCTION}:2",
        },
    }
    event.update(extra)
    return event


class RecordingS3:
    """put_object only, recorded; `error` makes it fail as S3 would."""

    def __init__(self, error: ClientError | None = None) -> None:
        self.puts: list[dict[str, Any]] = []
        self.error = error

    def put_object(self, **kwargs: Any) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        self.puts.append(kwargs)
        return {"VersionId": "v1", "ETag": '"e"'}


class Responses:
    """The responder: keeps what would have been PUT to the response URL."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.sizes: list[int] = []

    def __call__(self, url: str, body: bytes) -> None:
        self.sizes.append(len(body))
        self.sent.append((url, json.loads(body)))

    @property
    def only(self) -> dict[str, Any]:
        [(url, body)] = self.sent
        assert url == URL
        return body


@pytest.fixture
def responses() -> Responses:
    return Responses()


def denied() -> ClientError:
    return ClientError(
        {"Error": {"Code": "AccessDenied", "Message": "not authorized to s3:PutObject"}},
        "PutObject",
    )


@pytest.mark.parametrize("kind", ["Create", "Update"])
def test_create_and_update_put_the_glue_zip_and_answer_success(
    responses: Responses, kind: str
) -> None:
    s3 = RecordingS3()
    extra = {} if kind == "Create" else {"PhysicalResourceId": f"s3://{BUCKET}/{KEY}"}

    glue_code.on_event(request(kind, **extra), s3=s3, respond=responses)

    [put] = s3.puts
    assert (put["Bucket"], put["Key"]) == (BUCKET, KEY)
    expected, names = glue_zip.archive()
    assert put["Body"] == expected
    body = responses.only
    assert body["Status"] == "SUCCESS"
    assert body["PhysicalResourceId"] == f"s3://{BUCKET}/{KEY}"
    event = request(kind)
    for field in ("StackId", "RequestId", "LogicalResourceId"):
        assert body[field] == event[field]
    assert body["Data"] == {"Modules": len(names), "Bytes": len(expected), "VersionId": "v1"}


def test_the_zip_put_is_the_one_glue_zip_builds_with_the_job_modules_only(
    responses: Responses,
) -> None:
    s3 = RecordingS3()

    glue_code.on_event(request("Create"), s3=s3, respond=responses)

    with zipfile.ZipFile(BytesIO(s3.puts[0]["Body"])) as zipped:
        names = zipped.namelist()
    assert "delayq_reports/jobs.py" in names
    assert not {"delayq_reports/local_spark.py", "delayq_reports/bench.py"} & set(names)
    # Reproducible: the same package gives the same bytes (an unchanged package puts nothing new).
    assert glue_zip.archive()[0] == s3.puts[0]["Body"]


def test_delete_leaves_the_object_and_answers_success_with_the_same_id(
    responses: Responses,
) -> None:
    s3 = RecordingS3()
    physical = f"s3://{BUCKET}/{KEY}"

    glue_code.on_event(request("Delete", PhysicalResourceId=physical), s3=s3, respond=responses)

    assert s3.puts == []
    assert responses.only["Status"] == "SUCCESS"
    assert responses.only["PhysicalResourceId"] == physical


def test_a_failed_put_is_answered_failed_with_the_reason(responses: Responses) -> None:
    glue_code.on_event(request("Create"), s3=RecordingS3(denied()), respond=responses)

    body = responses.only
    assert body["Status"] == "FAILED"
    assert "AccessDenied" in body["Reason"]
    assert body["PhysicalResourceId"]  # required even when the create failed


def test_a_failed_build_is_answered_failed(responses: Responses) -> None:
    def broken() -> tuple[bytes, list[str]]:
        raise FileNotFoundError("no modules in /var/task/delayq_reports")

    glue_code.on_event(request("Update"), s3=RecordingS3(), respond=responses, build=broken)

    assert responses.only["Status"] == "FAILED"
    assert "no modules in /var/task/delayq_reports" in responses.only["Reason"]


@pytest.mark.parametrize(
    ("kind", "properties", "reason"),
    [
        ("Create", {"Bucket": BUCKET}, "Bucket and Key are required"),
        ("Update", {"Key": KEY, "Bucket": ""}, "Bucket and Key are required"),
        ("Refresh", {"Bucket": BUCKET, "Key": KEY}, "unknown RequestType 'Refresh'"),
    ],
)
def test_a_request_it_cannot_carry_out_is_answered_failed(
    responses: Responses, kind: str, properties: dict[str, Any], reason: str
) -> None:
    s3 = RecordingS3()

    glue_code.on_event(request(kind, ResourceProperties=properties), s3=s3, respond=responses)

    assert s3.puts == []
    assert responses.only["Status"] == "FAILED"
    assert reason in responses.only["Reason"]


def test_the_response_stays_under_cloudformations_4096_bytes(responses: Responses) -> None:
    huge = ClientError({"Error": {"Code": "InternalError", "Message": "x" * 10_000}}, "PutObject")

    glue_code.on_event(request("Create"), s3=RecordingS3(huge), respond=responses)

    assert responses.only["Status"] == "FAILED"
    assert responses.sizes[0] < 4096


@pytest.fixture
def s3_bucket() -> Iterator[Any]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        yield s3


def test_with_an_s3_client_the_object_holds_the_zip(s3_bucket: Any, responses: Responses) -> None:
    glue_code.on_event(request("Create"), s3=s3_bucket, respond=responses)

    stored = s3_bucket.get_object(Bucket=BUCKET, Key=KEY)
    assert stored["Body"].read() == glue_zip.archive()[0]
    assert responses.only["Data"]["VersionId"] == stored["VersionId"]


def test_send_response_puts_the_body_to_the_presigned_url(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[urllib.request.Request] = []

    class Answer:
        status = 200

        def __enter__(self) -> Answer:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def urlopen(req: urllib.request.Request, timeout: float) -> Answer:
        assert timeout == glue_code.RESPONSE_TIMEOUT_SECONDS
        sent.append(req)
        return Answer()

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)

    glue_code.send_response(URL, b'{"Status": "SUCCESS"}')

    [req] = sent
    assert (req.get_method(), req.full_url, req.data) == ("PUT", URL, b'{"Status": "SUCCESS"}')
    # S3 checks the pre-signed URL's signature, which covers no content type: send none.
    assert req.get_header("Content-type") == ""


def test_send_response_refuses_a_url_that_is_not_https() -> None:
    with pytest.raises(glue_code.GlueCodeError, match="not https"):
        glue_code.send_response("file:///etc/passwd", b"{}")


def test_handler_answers_with_the_real_clients(
    s3_bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, bytes]] = []
    monkeypatch.setattr(glue_code, "send_response", lambda url, body: sent.append((url, body)))

    response = glue_code.handler(request("Create"), context=None)

    assert response["Status"] == "SUCCESS"
    assert [url for url, _ in sent] == [URL]
    assert s3_bucket.get_object(Bucket=BUCKET, Key=KEY)["Body"].read() == glue_zip.archive()[0]
