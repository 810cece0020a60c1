"""Tenant limits: the DELAYQ_TENANT_LIMITS setting, parsed once, refused whole when wrong."""

from __future__ import annotations

import json

import pytest

from delayq.exceptions import ConfigurationError
from delayq.limits import UNKNOWN_TENANT, UNLIMITED, Limits, TenantLimits, parse_limits
from delayq.settings import Settings


def test_empty_setting_limits_nobody() -> None:
    for text in ("", "  ", "\n"):
        limits = parse_limits(text)
        assert limits == TenantLimits()
        assert not limits.any
        assert limits.of("anyone") is UNLIMITED


def test_named_tenants_and_the_default() -> None:
    limits = parse_limits(
        json.dumps(
            {
                "bulk-mailer": {
                    "release_per_second": 500,
                    "ingest_per_second": 2000,
                    "over_quota": "defer",
                },
                "orders.timeout": {"ingest_per_second": 10},
                "*": {"release_per_second": 20000},
            }
        )
    )
    assert limits.any
    assert limits.of("bulk-mailer") == Limits(500, 2000, "defer")
    assert limits.of("bulk-mailer").defers
    assert limits.of("orders.timeout") == Limits(None, 10, "reject")
    assert not limits.of("orders.timeout").defers
    assert limits.of("someone-else") == Limits(release_per_second=20000)


def test_a_default_alone_is_a_limit() -> None:
    assert parse_limits('{"*": {"ingest_per_second": 5}}').any
    assert not parse_limits('{"quiet": {}}').any


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "tenant limits are not JSON"),
        ("[1, 2]", "must be a JSON object of tenant -> limits"),
        ('{"a": 5}', "tenant limits of 'a': expected an object of limits"),
        ('{"": {}}', "tenant limits of '': expected an object of limits"),
        ('{"a": {"rate": 5}}', "unknown field(s) ['rate']"),
        ('{"a": {"over_quota": "drop"}}', "over_quota must be one of ('reject', 'defer')"),
        ('{"a": {"release_per_second": 0}}', "release_per_second must be a whole number >= 1"),
        ('{"a": {"ingest_per_second": -3}}', "ingest_per_second must be a whole number >= 1"),
        ('{"a": {"ingest_per_second": 2.5}}', "ingest_per_second must be a whole number >= 1"),
        ('{"a": {"ingest_per_second": "9"}}', "ingest_per_second must be a whole number >= 1"),
        ('{"a": {"release_per_second": true}}', "release_per_second must be a whole number"),
    ],
)
def test_a_wrong_setting_is_refused_with_the_reason(text: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_limits(text)
    assert problem in str(raised.value)


def test_settings_parse_the_limits_once_and_refuse_a_wrong_one(settings: Settings) -> None:
    shaped = settings.with_overrides(tenant_limits='{"a": {"release_per_second": 3}}')
    assert shaped.limits.of("a") == Limits(release_per_second=3)
    assert shaped.limits is shaped.limits
    with pytest.raises(ConfigurationError, match="tenant limits are not JSON"):
        settings.with_overrides(tenant_limits="nope")


BOUND = parse_limits(
    json.dumps(
        {
            "acme": {"ingest_per_second": 10, "topics": ["delay-acme"], "priorities": ["normal"]},
            "globex": {"release_per_second": 5, "topics": ["delay-globex", "delay-shared"]},
            "*": {"release_per_second": 1},
        }
    )
)


@pytest.mark.parametrize(
    ("declared", "topic", "tenant"),
    [
        ("acme", "delay-acme", "acme"),
        ("acme", "delay-globex", UNKNOWN_TENANT),  # globex's producers cannot spend acme's
        ("globex", "delay-shared", "globex"),
        ("rotating-1", "delay-acme", UNKNOWN_TENANT),  # unknown names share one bucket
        ("rotating-2", "delay-acme", UNKNOWN_TENANT),
        ("", "delay-acme", ""),  # no header: its target topic is its tenant, as before
    ],
)
def test_a_tenant_is_itself_only_on_the_delay_topics_it_is_bound_to(
    declared: str, topic: str, tenant: str
) -> None:
    assert BOUND.tenant_of(declared, topic) == tenant


def test_unknown_tenants_share_the_default_limits() -> None:
    assert BOUND.of(UNKNOWN_TENANT).release_per_second == 1


def test_without_topics_tenants_are_not_bound() -> None:
    limits = parse_limits('{"acme": {"ingest_per_second": 1}}')
    assert not limits.bound
    assert limits.tenant_of("anyone", "delay-x") == "anyone"


def test_a_tenant_uses_only_its_priorities() -> None:
    assert BOUND.allows_priority("acme", "normal")
    assert not BOUND.allows_priority("acme", "high")
    assert BOUND.allows_priority("globex", "high")


@pytest.mark.parametrize(
    "spec",
    [{"topics": []}, {"topics": "delay-a"}, {"topics": [1]}, {"priorities": ["urgent"]}],
)
def test_a_bad_binding_is_refused(spec: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        parse_limits(json.dumps({"acme": spec}))
