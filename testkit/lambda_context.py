"""What Lambda passes a handler as its context, for tests and benchmarks that call a handler
directly (no runtime: the remaining time is a number the caller sets, not a deadline).

The local stack's runtime has its own context (``delayq_local.sandbox.LambdaContext``): it is
product code, and counts down to a real deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LambdaContext:
    """The attributes and the one method of Lambda's Python context object that the handlers
    and Powertools use. ``invoked_function_arn`` and ``log_group_name`` follow
    ``function_name`` unless given; ``remaining_ms`` is what
    :meth:`get_remaining_time_in_millis` returns (set it to move a deadline)."""

    function_name: str = "delayq-test"
    function_version: str = "$LATEST"
    invoked_function_arn: str = ""
    memory_limit_in_mb: int = 512
    aws_request_id: str = "00000000-0000-4000-8000-000000000000"
    log_group_name: str = ""
    log_stream_name: str = "2026/11/21/[$LATEST]0"
    remaining_ms: int = 60_000
    identity: Any = None
    client_context: Any = None

    def __post_init__(self) -> None:
        if not self.invoked_function_arn:
            self.invoked_function_arn = (
                f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"
            )
        if not self.log_group_name:
            self.log_group_name = f"/aws/lambda/{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms
