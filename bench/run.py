"""Runs every benchmark and assembles ``results/bench.json``."""

from __future__ import annotations

import datetime as dt
import logging
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from bench import calls as calls_mod
from bench import cost as cost_mod
from bench import cpu as cpu_mod
from bench import instructions as instructions_mod
from bench import items as items_mod
from bench import memory as memory_mod
from bench.burst import (
    scale_costs,
    scale_deployment,
    scale_out_model,
    scheduler_probe,
    steady_emitter_concurrency,
)
from bench.fairness import FairnessOptions, aws_scale_model
from bench.fairness import measure_local as measure_fairness
from bench.handlers import measure_handlers
from bench.harness import bench_settings
from bench.local_stack import LocalOptions
from bench.local_stack import measure as measure_local
from bench.machine import describe
from bench.reference_mix import REFERENCE_MIX, Workload
from bench.template import deployed
from testkit.aws import write_units

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    """What to run and how big."""

    out: Path = Path("results")
    cpu: cpu_mod.CpuSettings = field(default_factory=cpu_mod.CpuSettings)
    instructions: instructions_mod.InstructionSettings = field(
        default_factory=instructions_mod.InstructionSettings
    )
    calls: calls_mod.CallSettings = field(default_factory=calls_mod.CallSettings)
    handler_batches: tuple[int, int] = (50, 50)
    item_variants: int = 1024
    memory_batches: int = 100
    probe_messages: int = 60_000
    probe_send_latency_ms: float = 10.0
    profile: str = "auto"
    local: LocalOptions = field(default_factory=LocalOptions)
    fairness: FairnessOptions = field(default_factory=FairnessOptions)
    command: str = "make bench"


QUICK = Options(
    cpu=cpu_mod.QUICK_CPU,
    instructions=instructions_mod.QUICK_INSTRUCTIONS,
    calls=calls_mod.QUICK_CALLS,
    handler_batches=(2, 1),
    item_variants=64,
    memory_batches=10,
    probe_messages=500,
    probe_send_latency_ms=2000.0,
    profile="never",
    local=LocalOptions(enabled="no"),
    fairness=FairnessOptions(enabled="no"),
    command="python -m bench --quick",
)


def _step(out: TextIO, text: str) -> float:
    out.write(f"== {text}\n")
    out.flush()
    return time.monotonic()


def _items_and_memory(options: Options, out: TextIO) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stored item sizes and the emitter's peak memory (a child process)."""
    t = _step(out, "stored items; emitter memory (real handler, mock Kafka cluster)")
    items = items_mod.measure_items(options.item_variants).as_dict()
    try:
        memory = memory_mod.measure_emitter_memory(options.memory_batches).as_dict()
    except Exception as e:  # noqa: BLE001 -- reported in bench.json, the rest still runs
        memory = {"emitter_peak_rss_mb": None, "method": f"not measured: {type(e).__name__}: {e}"}
    out.write(
        f"   item {items['json_item_bytes_max']} B (JSON) / {items['incompressible_item_bytes']} B "
        f"(random); emitter peak RSS {memory['emitter_peak_rss_mb']} MB "
        f"({time.monotonic() - t:.0f} s)\n"
    )
    return items, memory


def _instructions(options: Options, vs_floor: cpu_mod.FloorComparison, out: TextIO) -> None:
    """The floor ratios in instructions (callgrind), kept with the CPU-time ratios."""
    t = _step(out, "instructions against each handler's floor (valgrind callgrind)")
    counted = instructions_mod.measure_instructions(options.instructions)
    vs_floor.instructions = counted.as_dict()
    out.write(f"   {instructions_mod.summary(counted)} ({time.monotonic() - t:.0f} s)\n")


def _requests(
    options: Options, workload: Workload, out: TextIO
) -> tuple[calls_mod.CallFigures, dict[str, Any]]:
    """Requests per message by path, and what the pending counts add in the template's ingest
    batches (and the others measured)."""
    t = _step(out, "requests per message (in-memory clients)")
    call_figures = calls_mod.measure_calls(options.calls, workload)
    requests = call_figures.as_dict()
    requests["pending_counts"] = calls_mod.measure_pending_counts(
        options.calls.messages,
        workload,
        batches=(deployed().ingest_batch_size, *calls_mod.PENDING_BATCHES),
    )
    out.write(f"   sqs {requests['sqs']:.3f}/msg ({time.monotonic() - t:.0f} s)\n")
    return call_figures, requests


def run(options: Options, out: TextIO = sys.stderr) -> dict[str, Any]:
    """Every figure; the document written to bench.json."""
    machine = describe()
    settings = bench_settings()
    workload = REFERENCE_MIX

    t = _step(out, "handler CPU (in-memory clients) and CPU against each handler's floor")
    figures, vs_floor = cpu_mod.measure_with_floor(options.cpu, profile=options.profile)
    ingest_b, emitter_b = options.handler_batches
    handlers = measure_handlers(ingest_b, emitter_b, max(1, min(3, options.cpu.repeats)))
    out.write(
        "   "
        + ", ".join(f"{n} {f.messages_per_second:,.0f}/s" for n, f in figures.items())
        + "; vs floor "
        + ", ".join(
            f"{n} {'n/a' if r is None else f'{r:.2f}x'}" for n, r in vs_floor.ratios.items()
        )
        + f" ({time.monotonic() - t:.0f} s)\n"
    )

    _instructions(options, vs_floor, out)

    call_figures, requests = _requests(options, workload, out)

    _step(out, "cost model")
    sched = figures["scheduler"]
    per_second_run = sched.inputs["stored_messages_per_second"]
    scheduler_cpu_ms_per_second = (
        sched.cpu_ms_per_invocation / sched.inputs["due_seconds_per_run"]
    ) * (workload.long_per_second / per_second_run)
    item_bytes = cost_mod.stored_item_bytes()
    measured = cost_mod.MeasuredInputs(
        short=call_figures.paths["short"].summary(),
        long=call_figures.paths["long"].summary(),
        mix=call_figures.paths["mix"].summary(),
        ingest_cpu_ms_per_batch=handlers["ingest"].cpu_ms_per_invocation,
        ingest_batch=handlers["ingest"].messages_per_invocation,
        emitter_cpu_ms_per_batch=handlers["emitter"].cpu_ms_per_invocation,
        emitter_batch=handlers["emitter"].messages_per_invocation,
        scheduler_cpu_ms_per_second=scheduler_cpu_ms_per_second,
        ingest_log_bytes=handlers["ingest"].stdout_bytes_per_invocation,
        emitter_log_bytes=handlers["emitter"].stdout_bytes_per_invocation,
        item_bytes=item_bytes,
        lead_ms=settings.emit_lead_ms,
        max_hold_ms=settings.max_hold_ms,
        pending_wru=calls_mod.pending_wru(requests["pending_counts"], deployed().ingest_batch_size),
    )
    model = cost_mod.build(measured, workload)

    items, memory = _items_and_memory(options, out)

    t = _step(out, "burst: scheduler probe (in-memory, simulated latency) and 10 M model")
    probe = scheduler_probe(options.probe_messages, send_latency_ms=options.probe_send_latency_ms)
    a = model.assumptions
    batch = cost_mod.measured_emitter_batch(measured, workload, model.functions, a)
    hold = cost_mod.emitter_hold_ms(
        settings.emit_lead_ms, batch, settings.max_hold_ms, a.ms_poll_latency
    )
    steady_conc = steady_emitter_concurrency(workload.per_second, hold, batch)
    costs = scale_costs(
        ingest_cpu_ms_per_batch=measured.ingest_cpu_ms_per_batch,
        scheduler_cpu_ms_per_message=scheduler_cpu_ms_per_second / workload.long_per_second,
        emitter_cpu_ms_per_message=measured.emitter_cpu_ms_per_batch / measured.emitter_batch,
        assumptions=a,
    )
    deployment = scale_deployment(
        settings,
        model.functions,
        steady_emitter_concurrency=min(steady_conc, model.functions.emitter_max_concurrency),
    )
    burst_model = scale_out_model(
        messages=10_000_000,
        deployment=deployment,
        costs=costs,
        item_bytes=item_bytes,
        wru_per_item=write_units(item_bytes),
    )
    burst_model.notes.append(
        f"steady state at {workload.per_second:,.0f} messages/s needs ~{steady_conc} concurrent "
        f"emitters (batches of {batch:g} held {hold:.0f} ms); the template's default "
        f"EmitterMaxConcurrency "
        f"is {model.functions.emitter_max_concurrency}"
        + (
            ": the emitter FALLS BEHIND at 100 M/day with the default"
            if steady_conc > model.functions.emitter_max_concurrency
            else ""
        )
    )
    out.write(f"   ({time.monotonic() - t:.0f} s)\n")

    local: dict[str, Any] | None = None
    local_error = ""
    if options.local.enabled != "no":
        t = _step(out, "local stack: burst, steady lateness, requests per message")
        try:
            local = measure_local(options.local, out)
            out.write(f"   ({time.monotonic() - t:.0f} s)\n")
        except Exception as e:
            if options.local.enabled == "yes":
                raise
            local_error = f"{type(e).__name__}: {e}"
            log.warning("local stack measurements skipped: %s", local_error)
            out.write(f"   skipped: {local_error}\n")

    fairness = _fairness(
        options,
        out,
        scale_inputs={
            "deployment": deployment,
            "costs": costs,
            "item_bytes": item_bytes,
            "wru_per_item": write_units(item_bytes),
        },
    )

    doc = assemble(
        options=options,
        machine=machine,
        figures=figures,
        vs_floor=vs_floor,
        handlers=handlers,
        requests=requests,
        model=model,
        probe=probe.as_dict(),
        burst_model=burst_model.as_dict(),
        local=local,
        local_error=local_error,
        hold_ms=hold,
        stored_item=items,
        emitter_memory=memory,
    )
    doc["fairness"] = fairness
    return doc


def _fairness(options: Options, out: TextIO, scale_inputs: dict[str, Any]) -> dict[str, Any]:
    """Bystander and burst lateness: simulated at AWS scale (the same deployment and costs as
    the burst model), measured on the local stack."""
    t = _step(out, "fairness at AWS scale (the scale model, before / after the tenant features)")
    aws = aws_scale_model(messages=10_000_000, **scale_inputs)
    out.write(f"   ({time.monotonic() - t:.0f} s)\n")
    result: dict[str, Any] = {"aws_scale": aws, "local": None, "local_error": ""}
    if options.fairness.enabled == "no":
        return result
    t = _step(out, "local stack: fairness (a burst of one tenant, another tenant due during it)")
    try:
        result["local"] = measure_fairness(options.fairness, out)
        out.write(f"   ({time.monotonic() - t:.0f} s)\n")
    except Exception as e:
        if options.fairness.enabled == "yes":
            raise
        result["local_error"] = f"{type(e).__name__}: {e}"
        log.warning("local fairness measurements skipped: %s", result["local_error"])
        out.write(f"   skipped: {result['local_error']}\n")
    return result


def assemble(
    *,
    options: Options,
    machine: dict[str, Any],
    figures: dict[str, cpu_mod.CpuFigure],
    vs_floor: cpu_mod.FloorComparison | None = None,
    handlers: dict[str, Any],
    requests: dict[str, Any],
    model: cost_mod.CostModel,
    probe: dict[str, Any],
    burst_model: dict[str, Any],
    local: dict[str, Any] | None,
    local_error: str,
    hold_ms: float,
    stored_item: dict[str, Any],
    emitter_memory: dict[str, Any],
) -> dict[str, Any]:
    """The bench.json document."""
    settings = bench_settings()
    cpu = {name: round(f.messages_per_second) for name, f in figures.items()}
    cpu_doc: dict[str, Any] = {
        **cpu,
        "method": cpu_mod.METHOD,
        "details": {name: f.as_dict() for name, f in figures.items()},
        "handlers_with_telemetry": {n: h.as_dict() for n, h in handlers.items()},
    }
    if local and local.get("lateness"):
        lateness = local["lateness"]
    else:
        lateness = {
            "p50": None,
            "p99": None,
            "max": None,
            "early": None,
            "met": None,
            "early_met": None,
            "source": "not measured: the local stack did not run"
            + (f" ({local_error})" if local_error else ""),
            "model_emitter_hold_ms": round(hold_ms),
        }
    if local and local.get("burst"):
        burst = {**local["burst"]}
    else:
        burst = {
            "messages": burst_model["messages"],
            "drain_seconds": burst_model["drain_seconds_after_due"],
            "messages_per_second": burst_model["drain_messages_per_second"],
            "source": "model (AWS scale-out), not measured: the local stack did not run",
        }
    burst["scale_out_10m"] = burst_model
    burst["scheduler_probe"] = probe
    req = {**requests}
    if local and local.get("requests"):
        req["local_stack"] = local["requests"]
    doc: dict[str, Any] = {
        "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": options.command,
        "machine": machine,
        "settings": {
            k: v
            for k, v in asdict(settings).items()
            if k
            in (
                "horizon_seconds",
                "lookahead_seconds",
                "tick_seconds",
                "shards",
                "emit_lead_ms",
                "max_hold_ms",
                "ttl_grace_seconds",
            )
        },
        "requests_per_message": req,
        "cpu_messages_per_second": cpu_doc,
        "cpu_vs_floor": vs_floor.as_dict() if vs_floor is not None else None,
        "lateness_ms": lateness,
        "burst": burst,
        "cost_usd_per_million": {**model.headline(), "details": model.as_dict()},
        "stored_item": stored_item,
        "emitter_memory": emitter_memory,
    }
    if local:
        doc["local_stack"] = {k: v for k, v in local.items() if k not in ("lateness", "burst")}
    doc["findings"] = findings(doc)
    return doc


def findings(doc: dict[str, Any]) -> list[str]:
    """Plain sentences for every missed target and modelled failure."""
    out: list[str] = []
    req = doc["requests_per_message"]
    t = req["targets"]
    item_bytes = doc["cost_usd_per_million"]["details"]["measured_inputs"]["item_bytes"]
    if not t["dynamodb_writes_long"]["met_in_request_units"]:
        out.append(
            f"DynamoDB writes: {req['dynamodb_writes_long']:.3f} WRU per long message: the "
            f"stored item of a 1 KB message is {item_bytes} B = {write_units(item_bytes)} WRU; "
            "the rest is the watermark and the delivery statistics"
        )
    out += _storage_findings(doc)
    long_stages = req["by_path"]["long"]["by_stage"]
    scheduler_cancel_reads = long_stages.get("scheduler", {}).get("dynamodb.BatchGetItem", 0) > 0
    if not t["dynamodb_reads_long"]["met_in_request_units"]:
        out.append(
            f"DynamoDB reads: {req['dynamodb_reads_long']:.2f} RRU "
            f"({req['dynamodb_read_calls_long']:.3f} calls) per long message: cancel markers "
            + (
                "are read twice per message (scheduler and emitter BatchGetItem"
                if scheduler_cancel_reads
                else "are read once per message (the emitter's BatchGetItem"
            )
            + ", strongly consistent: 1 RRU per key even when absent;"
            " plus the scheduler's strongly consistent Queries)"
        )
    if not t["sqs"]["met"]:
        out.append(f"SQS: {req['sqs']:.3f} requests per message, over 0.35")
    for name, d in doc["cpu_messages_per_second"]["details"].items():
        if d.get("target_met") is False:
            out.append(f"{name} CPU {d['messages_per_second']:,.0f}/s is under the 15,000/s target")
    floor = doc.get("cpu_vs_floor") or {}
    for name, met in (floor.get("met") or {}).items():
        if met is False:
            out.append(
                f"{name} CPU is {floor[name]:.2f}x its floor's (goal <= {floor['goal']:g}x; "
                f"floor {floor['floor_messages_per_second'][name]:,}/s on this machine)"
            )
    cost = doc["cost_usd_per_million"]
    details = cost["details"]
    if not details["target"]["met"]:
        top = max(details["designs"]["this_design"]["lines"], key=lambda x: x["usd_per_million"])
        out.append(
            f"cost ${cost['this_design']:.2f} per million (target $0.75); largest line: "
            f"{top['component']} ${top['usd_per_million']:.2f} ({top['detail']})"
        )
    out += [n for n in details["designs"]["this_design"]["notes"] if "FALLS BEHIND" in n]
    model = doc["burst"]["scale_out_10m"]
    out += [n for n in model["notes"] if "FALLS BEHIND" in n]
    probe = doc["burst"]["scheduler_probe"]
    if not probe["completed"]:
        out.append(
            f"scheduler probe: {probe['messages']:,} messages in one due-second, "
            f"{probe['send_latency_ms']:g} ms per SendMessageBatch: {len(probe['ticks'])} ticks "
            f"each sent {probe['ticks'][0]['sent']:,} and were stopped at the timeout; the "
            f"watermark never moved ({probe['duplicates_sent']:,} duplicates sent)"
        )
    overruns = [t for t in doc["burst"].get("invocations_past_timeout", []) if "Scheduler" in t]
    if overruns:
        out.append(
            "local burst: " + "; ".join(overruns) + " (the local runtime lets it finish; Lambda "
            "would stop it and the next tick would start the second again: see the probe)"
        )
    lat = doc["lateness_ms"]
    if lat.get("sustained") is False:
        out.append(
            f"local steady run at {lat['rate_per_second']:g}/s was not sustained: p99 grew from "
            f"{lat['p99_first_third']} ms to {lat['p99_last_third']} ms"
        )
    if lat.get("met") is False or lat.get("early_met") is False:
        out.append(
            f"lateness p99 {lat['p99']} ms / max {lat['max']} ms / early {lat['early']} "
            f"({lat['source']})"
        )
    return out


def _storage_findings(doc: dict[str, Any]) -> list[str]:
    """What a stored item and the emitter's memory say."""
    out: list[str] = []
    stored = doc.get("stored_item")
    if stored:
        out.append(
            f"a 1 KB message whose value zlib cannot shrink (random bytes) is stored as "
            f"{stored['incompressible_item_bytes']} B = {stored['incompressible_item_wru']} WRU "
            f"(JSON: {stored['json_item_bytes_max']} B at most); such values fit one WRU up to "
            f"{stored['largest_incompressible_value_in_one_wru']} B"
        )
    memory = doc.get("emitter_memory") or {}
    if memory.get("suggested_memory_mb") and (
        memory["suggested_memory_mb"] != memory["template_memory_mb"]
    ):
        out.append(
            f"emitter memory: template {memory['template_memory_mb']} MB, measured peak RSS "
            f"{memory['emitter_peak_rss_mb']} MB suggests {memory['suggested_memory_mb']} MB"
        )
    return out


def with_overrides(options: Options, **kw: Any) -> Options:
    """A copy of the options with fields replaced."""
    return replace(options, **kw)


__all__ = ["QUICK", "LocalOptions", "Options", "run", "with_overrides"]
