"""sim.scale: the AWS-scale model against cases checkable by hand, and the properties its
figures rely on (more capacity is never slower, caps hold, priorities isolate, seeds repeat)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.scale import (
    BOUND_POLLER_BYTES,
    BURST,
    BYSTANDER,
    LAMBDA_FULL_VCPU_MB,
    LATE_CLOCKS,
    LATE_SCHEDULER,
    LATE_SOURCE,
    LATE_TARGET,
    SCHEDULER_CPU,
    SQS_POLLER_BYTES_PER_SECOND,
    Costs,
    Deployment,
    EventSource,
    Lateness,
    TargetCluster,
    Traffic,
    simulate,
)

# Everything free but what a test prices: the figures then follow from its numbers alone.
FREE = Costs(
    ingest_cpu_ms_per_batch=0.0,
    scheduler_cpu_ms_per_message=0.0,
    emitter_cpu_ms_per_message=0.0,
    ms_dynamodb_batch_write=0.0,
    ms_dynamodb_get=0.0,
    ms_dynamodb_batch_get=0.0,
    ms_dynamodb_query=0.0,
    ms_dynamodb_update=0.0,
    ms_sqs_send_batch=0.0,
    ms_sqs_receive=0.0,
    ms_lambda_invoke=0.0,
    ms_kafka_flush=0.0,
)
ONE_VCPU = {"ingest": LAMBDA_FULL_VCPU_MB, "scheduler": LAMBDA_FULL_VCPU_MB, "emitter": 1769}


def sources(**kw: object) -> dict[str, EventSource]:
    return {p: EventSource(**kw) for p in ("high", "normal", "low")}  # type: ignore[arg-type]


def deployment(**kw: object) -> Deployment:
    base = Deployment(memory_mb=ONE_VCPU, bundle_max_messages=1, sources=sources())
    return replace(base, **kw)  # type: ignore[arg-type]


def test_one_invocation_at_a_time_drains_at_its_cpu_rate_exactly() -> None:
    # 100 messages a batch (bundles of one), 1 ms of CPU each at one vCPU, one invocation at a
    # time, everything else free (a lone invocation reads its clocks without waiting). The
    # first batch is read while it waits for its due time and takes 100 ms from due; each of
    # the 99 others takes 100 ms, and the next starts on the following whole millisecond.
    costs = replace(FREE, emitter_cpu_ms_per_message=1.0)
    d = deployment(sources=sources(max_concurrency=1))
    run = simulate(d, costs, Traffic(10_000))
    assert run.drain_seconds_after_due == pytest.approx((100 + 99 * 101) / 1000, abs=0.002)
    assert run.sources["normal"].invocations == 100
    assert run.sources["normal"].peak_concurrency == 1
    assert run.delivered[BURST] == 10_000
    late = run.lateness_after_due[BURST].summary()
    assert 5_000 <= (late["p50"] or 0) <= 5_300
    assert 10_000 <= (late["max"] or 0) <= 10_099


def test_the_vcpu_share_slows_the_emitter_in_proportion() -> None:
    costs = replace(FREE, emitter_cpu_ms_per_message=1.0)
    one = deployment(sources=sources(max_concurrency=1))
    half = replace(one, memory_mb={**ONE_VCPU, "emitter": LAMBDA_FULL_VCPU_MB // 2})
    full = simulate(one, costs, Traffic(10_000)).drain_seconds_after_due or 0
    slow = simulate(half, costs, Traffic(10_000)).drain_seconds_after_due or 0
    # Half a vCPU doubles the 100 ms of CPU of each of the 100 invocations (884 MB is a hair
    # under half, and each invocation ends on a whole millisecond).
    assert slow - full == pytest.approx(10.0, abs=0.15)


def test_a_crowded_second_spans_as_many_scheduler_runs_as_its_rounds_need() -> None:
    # A round is 16 shards x 250 items = 4,000 messages at 0.25 ms each: one second. A run has
    # 60 s less 10 s of safety: 50 rounds, 200,000 messages.
    costs = replace(FREE, scheduler_cpu_ms_per_message=0.25)
    run = simulate(deployment(), costs, Traffic(1_000_000))
    assert run.scheduler_rounds == 250
    assert run.scheduler_runs == 5
    assert run.scheduler_bound == SCHEDULER_CPU


def test_a_scheduler_that_cannot_finish_within_the_look_ahead_makes_the_burst_late() -> None:
    costs = replace(FREE, scheduler_cpu_ms_per_message=0.25)
    d = deployment(lookahead_s=120)
    run = simulate(d, costs, Traffic(1_000_000))
    assert (run.drain_seconds_after_due or 0) > 100
    assert run.late_mostly_in(BURST) == LATE_SCHEDULER


@pytest.mark.parametrize("field", ["max_concurrency", "minimum_pollers"])
def test_more_concurrency_or_pollers_is_never_slower(field: str) -> None:
    costs = replace(FREE, emitter_cpu_ms_per_message=0.5, ms_sqs_receive=10.0)
    drains = []
    for n in (2, 4, 10, 40, 100):
        run = simulate(deployment(sources=sources(**{field: n})), costs, Traffic(400_000))
        drains.append(run.drain_seconds_after_due or 0)
    assert drains == sorted(drains, reverse=True)
    assert drains[0] > drains[-1]


def test_provisioned_pollers_pull_at_most_their_bytes_a_second() -> None:
    # Two pollers at ~1 MB/s, messages of 1,516 B in the queue, everything else free.
    traffic = Traffic(200_000)
    d = deployment(sources=sources(minimum_pollers=2, maximum_pollers=2))
    run = simulate(d, FREE, traffic)
    pulled = 2 * SQS_POLLER_BYTES_PER_SECOND / traffic.body_bytes
    # Pulling starts at the emit lead (1.5 s) before due with a full second's budget.
    assert 200_000 / pulled - 3 <= (run.drain_seconds_after_due or 0) <= 200_000 / pulled + 1
    assert run.sources["normal"].bound_by == BOUND_POLLER_BYTES


def test_account_concurrency_bounds_every_event_source_together() -> None:
    costs = replace(FREE, emitter_cpu_ms_per_message=0.5)
    d = deployment(sources=sources(max_concurrency=1000), account_concurrency=30)
    run = simulate(d, costs, Traffic(300_000, written_before_due_s=3600))
    assert run.peak_account_concurrency <= 30
    assert run.sources["normal"].peak_concurrency <= 30


def test_a_release_cap_spreads_the_burst_and_nothing_leaves_before_its_slot() -> None:
    costs = replace(FREE, emitter_cpu_ms_per_message=0.01)
    traffic = Traffic(100_000, burst_cap_per_second=5_000, bystander_rate=20)
    run = simulate(deployment(), costs, traffic)
    assert run.max_released_per_second == 5_000
    release = run.lateness_from_release[BURST]
    assert min(ms for ms, _ in release.samples) >= 0
    after_due = run.lateness_after_due[BURST].summary()
    # The last slot is 19 s after due: the cap, not the pipeline, spreads it.
    assert 19_000 <= (after_due["max"] or 0) < 21_000
    assert (release.summary()["p99"] or 0) < 1_000
    assert min(ms for ms, _ in run.lateness_after_due[BYSTANDER].samples) >= 0


def test_low_priority_keeps_bystanders_out_of_the_bursts_queue() -> None:
    # The emitter is the bottleneck (two invocations per queue): sharing a queue, the
    # bystanders wait behind the burst; with the burst in the low-priority queue they do not.
    costs = replace(FREE, emitter_cpu_ms_per_message=0.5)
    d = deployment(sources=sources(max_concurrency=2))
    shared = simulate(d, costs, Traffic(200_000, bystander_rate=20))
    apart = simulate(d, costs, Traffic(200_000, bystander_rate=20, burst_priority="low"))
    assert (shared.lateness_after_due[BYSTANDER].summary()["p99"] or 0) > 10_000
    assert shared.late_mostly_in(BYSTANDER) == LATE_SOURCE
    assert (apart.lateness_after_due[BYSTANDER].summary()["p99"] or 0) < 100
    assert apart.delivered[BYSTANDER] == 1_200
    assert apart.sources["low"].messages == 200_000


def test_the_same_seed_gives_the_same_figures() -> None:
    costs = replace(FREE, emitter_cpu_ms_per_message=0.1, scheduler_cpu_ms_per_message=0.05)
    traffic = Traffic(300_000, bystander_rate=20)
    a, b = (simulate(deployment(), costs, traffic, seed=7) for _ in range(2))
    assert a.lateness_after_due[BYSTANDER].samples == b.lateness_after_due[BYSTANDER].samples
    assert a.lateness_after_due[BURST].samples == b.lateness_after_due[BURST].samples
    assert a.stages == b.stages
    other = simulate(deployment(), costs, traffic, seed=8)
    assert other.lateness_after_due[BYSTANDER].samples != a.lateness_after_due[BYSTANDER].samples


def test_weighted_percentiles() -> None:
    late = Lateness()
    late.add(10.0, 98)
    late.add(500.0, 1)
    late.add(900.0, 1)
    assert late.summary() == {"p50": 10, "p99": 500, "max": 900}
    assert Lateness().summary() == {"p50": None, "p99": None, "max": None}


def test_the_control_clock_reads_bound_every_emitter_together() -> None:
    # Every invocation reads every shard's clock once: each clock#<shard> partition serves
    # 3,000 reads a second, however many emitters run, so batches of 100 drain at 300,000
    # messages a second; more shards read no faster (each invocation reads them all).
    traffic = Traffic(480_000)
    run = simulate(deployment(), FREE, traffic)
    assert run.drain_seconds_after_due == pytest.approx(480_000 / 300_000, abs=0.05)
    assert run.late_mostly_in(BURST) == LATE_CLOCKS
    wider = simulate(deployment(shards=64), FREE, traffic)
    assert wider.drain_seconds_after_due == run.drain_seconds_after_due


def test_the_target_cluster_bounds_every_emitter_together() -> None:
    # One broker taking 10 MBps: 100,000 records of 1,184 bytes need 11.84 s, and nothing else
    # costs anything, so the burst drains in exactly that and its lateness is the cluster's.
    slow = TargetCluster(brokers=1, broker_type="kafka.t3.small", ingress_mbps=10.0)
    run = simulate(deployment(target=slow), FREE, Traffic(100_000))
    assert run.target_cluster_seconds == pytest.approx(100_000 * 1_184 / 10e6)
    assert run.drain_seconds_after_due == pytest.approx(run.target_cluster_seconds, abs=0.05)
    assert run.late_mostly_in(BURST) == LATE_TARGET
    # The default cluster (three of the largest Express brokers) takes the burst far faster.
    assert Deployment().target.seconds_for(100_000, 1_184) < 0.1
