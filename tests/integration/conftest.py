"""Fixtures for the local-stack tests: one moto server per session, a mock Kafka cluster per
module, a fresh stack name (so resources never collide) per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from delayq_local import (
    AwsEndpoint,
    Deployment,
    MockKafkaCluster,
    MotoServer,
    Template,
    load_template,
    provision,
)
from tests.integration.support import FIXTURES, Runner


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    # In this process: some tests look into moto's backends.
    with MotoServer(in_process=True) as server:
        yield server


@pytest.fixture
def endpoint(moto_server: MotoServer) -> AwsEndpoint:
    return AwsEndpoint(moto_server.endpoint_url)


@pytest.fixture
def stack_name() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def fixture_template() -> Template:
    return load_template(FIXTURES / "template.yaml")


@pytest.fixture
def deployment(fixture_template: Template, endpoint: AwsEndpoint, stack_name: str) -> Deployment:
    return provision(fixture_template, stack_name, endpoint)


@pytest.fixture(scope="module")
def kafka() -> Iterator[MockKafkaCluster]:
    with MockKafkaCluster(brokers=1) as cluster:
        yield cluster


@pytest.fixture
def topic(kafka: MockKafkaCluster) -> str:
    name = f"topic-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(name, partitions=2)
    return name


@pytest.fixture
def running() -> Iterator[Runner]:
    runner = Runner()
    yield runner
    for source in reversed(runner.started):
        source.stop()
