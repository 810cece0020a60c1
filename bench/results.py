"""The results: ``results/bench.json`` (every figure with its method, inputs and machine),
``results/bench.md`` (the table for the README) and the same table on the console."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.machine import one_line


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: ""}[met]


def _floor_rows(floor: Mapping[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Each handler's CPU per message as a multiple of its floor's (machine-independent)."""
    rows: list[tuple[str, str, str, str, str]] = []
    sources = {
        "ingest": "same run: base64 decode + deflate + json.dumps of the requests sent",
        "emitter": "same run: json.loads + base64 + confluent produce() (mock cluster)",
    }
    for name in ("ingest", "emitter"):
        if name not in floor:
            continue
        ratio = floor[name]
        rate = (floor.get("floor_messages_per_second") or {}).get(name)
        rows.append(
            (
                f"{name} CPU vs its floor (machine-independent)",
                "n/a" if ratio is None else f"{ratio:.2f}x",
                f"<= {floor['goal']:g}x floor",
                _verdict((floor.get("met") or {}).get(name)),
                sources[name] + (f"; floor {_fmt(rate)}/s here" if rate else ""),
            )
        )
    without = floor.get("ingest_vs_floor_without_deflate")
    if without is not None:
        rows.append(
            (
                "ingest CPU vs its floor without deflating",
                f"{without:.2f}x",
                "",
                "",
                "same run; the floor of the figures before 2026-11-26 (no goal)",
            )
        )
    counted = floor.get("instructions") or {}
    for name in ("ingest", "emitter"):
        if name not in counted:
            continue
        ratio = counted[name]
        per = (counted.get("per_message") or {}).get(name) or {}
        rows.append(
            (
                f"{name} instructions vs its floor (machine-independent)",
                "n/a" if ratio is None else f"{ratio:.2f}x",
                f"<= {floor['goal']:g}x floor",
                "" if ratio is None else _verdict(ratio <= floor["goal"]),
                (counted.get("skipped") or {}).get(name)
                or f"valgrind callgrind, same inputs; {_fmt(per.get('handler'))} vs "
                f"{_fmt(per.get('floor'))} instructions per message",
            )
        )
    return rows


def summary_rows(doc: Mapping[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(figure, value, target, verdict, source) rows of the headline table."""
    req = doc["requests_per_message"]
    cpu = doc["cpu_messages_per_second"]
    lat = doc["lateness_ms"]
    burst = doc["burst"]
    cost = doc["cost_usd_per_million"]
    targets = req["targets"]
    rows: list[tuple[str, str, str, str, str]] = [
        (
            "SQS requests per message (mix)",
            _fmt(req["sqs"], 3),
            "<= 0.35",
            _verdict(targets["sqs"]["met"]),
            req["source"],
        ),
        (
            "DynamoDB writes per long message (WRU / calls)",
            f"{_fmt(req['dynamodb_writes_long'], 3)} / {_fmt(req['dynamodb_write_calls_long'], 3)}",
            "<= 1.0",
            f"{_verdict(targets['dynamodb_writes_long']['met_in_request_units'])} / "
            f"{_verdict(targets['dynamodb_writes_long']['met_in_calls'])}",
            req["source"],
        ),
        (
            "DynamoDB reads per long message (RRU / calls)",
            f"{_fmt(req['dynamodb_reads_long'], 3)} / {_fmt(req['dynamodb_read_calls_long'], 3)}",
            "<= 0.1",
            f"{_verdict(targets['dynamodb_reads_long']['met_in_request_units'])} / "
            f"{_verdict(targets['dynamodb_reads_long']['met_in_calls'])}",
            req["source"],
        ),
    ]
    for name in ("ingest", "scheduler", "emitter"):
        detail = cpu["details"][name]
        target = detail.get("target_per_second")
        rows.append(
            (
                f"{name} CPU, messages/s per core (machine-dependent)",
                _fmt(cpu[name]),
                f">= {target:,}" if target else "",
                _verdict(detail.get("target_met")),
                "median of timed runs, in-memory clients; varies ~3x between machines",
            )
        )
    rows += _floor_rows(doc.get("cpu_vs_floor") or {})
    rows += [
        (
            "lateness p50 / p99 / max (ms)",
            f"{_fmt(lat['p50'], 0)} / {_fmt(lat['p99'], 0)} / {_fmt(lat['max'], 0)}",
            "p99 <= 500, max <= 1000",
            _verdict(lat.get("met")),
            lat["source"],
        ),
        (
            "early deliveries",
            _fmt(lat["early"]),
            "0",
            _verdict(lat.get("early_met")),
            lat["source"],
        ),
        (
            f"burst: {_fmt(burst['messages'])} messages in one due-second",
            f"{_fmt(burst['drain_seconds'], 1)} s, {_fmt(burst['messages_per_second'])} msg/s",
            "",
            "",
            burst["source"],
        ),
    ]
    model = burst.get("scale_out_10m") or {}
    if model:
        rows.append(
            (
                f"burst model: {_fmt(model['messages'])} in AWS",
                f"{_fmt(model['drain_seconds_after_due'], 0)} s after due, "
                f"{_fmt(model['drain_messages_per_second'])} msg/s "
                f"({model['scheduler_runs']} scheduler runs)",
                "",
                "",
                model.get("source", "model"),
            )
        )
    rows += _fairness_rows(doc.get("fairness") or {})
    stored = doc.get("stored_item")
    if stored:
        rows.append(
            (
                "stored item of a 1 KB message: JSON event / random bytes",
                f"{_fmt(stored['json_item_bytes_max'])} B ({stored['json_item_wru_max']} WRU) / "
                f"{_fmt(stored['incompressible_item_bytes'])} B "
                f"({stored['incompressible_item_wru']} WRU)",
                "<= 1,024 B",
                f"{_verdict(stored['json_item_wru_max'] <= 1)} / "
                f"{_verdict(stored['incompressible_item_wru'] <= 1)}",
                "delayq.store.message_item, DynamoDB item size rules (max over "
                f"{stored['variants']} JSON events)",
            )
        )
    memory = doc.get("emitter_memory")
    if memory:
        rows.append(
            (
                "emitter peak RSS (MB) -> memory setting",
                f"{_fmt(memory['emitter_peak_rss_mb'], 1)} -> "
                + (
                    f"{memory['suggested_memory_mb']} MB (template {memory['template_memory_mb']})"
                    if memory.get("suggested_memory_mb")
                    else "n/a"
                ),
                "2 x (peak + runtime)",
                "",
                "real handler and producer, mock Kafka cluster; VmHWM",
            )
        )
    rows.append(
        (
            "cost, this design ($ per million)",
            _fmt(cost["this_design"], 3),
            "<= 0.75",
            _verdict(cost["details"]["target"]["met"]),
            "model: measured requests + CPU, list prices " + cost["details"]["prices_as_of"],
        )
    )
    return rows


def cost_rows(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Design and dollars per million."""
    cost = doc["cost_usd_per_million"]
    names = {
        "this_design": "this design (watermark + TTL)",
        "explicit_delete": "this design + explicit delete",
        "sqs_reenqueue": "SQS-only, re-enqueue every 15 min",
        "eventbridge_scheduler": "EventBridge Scheduler, one schedule per message",
        "step_functions": "Step Functions, one Wait per message",
    }
    return [(label, f"${cost[key]:,.2f}") for key, label in names.items()]


def markdown(doc: Mapping[str, Any]) -> str:
    """results/bench.md: the README's performance table, with how it was made."""
    lines = [
        "<!-- generated by `make bench` (bench/results.py); do not edit -->",
        f"Measured with `{doc['command']}` on {one_line(doc['machine'])}, {doc['generated']}.",
        "",
        "| figure | value | target | | method / source |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in summary_rows(doc)]
    details = doc["cost_usd_per_million"]["details"]
    lines += [
        "",
        f"Cost per million messages, {details['workload']} "
        f"(us-east-1 list prices of {details['prices_as_of']}):",
        "",
        "| design | $ per million messages |",
        "|---|---|",
    ]
    lines += [f"| {a} | {b} |" for a, b in cost_rows(doc)]
    top = sorted(details["designs"]["this_design"]["lines"], key=lambda x: -x["usd_per_million"])[
        :4
    ]
    lines += [
        "",
        "Largest lines of this design: "
        + "; ".join(f"{x['component']} ${x['usd_per_million']:.2f}" for x in top)
        + ". Method, inputs and assumptions: [docs/benchmarks.md](docs/benchmarks.md) "
        "and `results/bench.json`.",
    ]
    return "\n".join(lines) + "\n"


def console(doc: Mapping[str, Any]) -> str:
    """The headline table and the cost comparison as plain text."""
    rows = summary_rows(doc)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    out = [f"bench: {doc['command']}", f"machine: {one_line(doc['machine'])}", ""]
    for row in rows:
        cells = [row[i].replace("**", "").ljust(widths[i]) for i in range(4)]
        out.append("  ".join(cells) + f"  [{row[4]}]")
    out.append("")
    out.append(
        "cost per million messages (" + doc["cost_usd_per_million"]["details"]["workload"] + ")"
    )
    for label, value in cost_rows(doc):
        out.append(f"  {label:<50} {value:>10}")
    out += _details(doc)
    notes = doc.get("findings") or []
    if notes:
        out.append("")
        out.append("findings:")
        out += [f"  - {n}" for n in notes]
    return "\n".join(out) + "\n"


def _pending_lines(pending: Mapping[str, Any] | None) -> list[str]:
    """What the pending counts add per message, by delay mix and ingest batch size."""
    if not pending:
        return []
    return [f"  pending counts (DELAYQ_PENDING_COUNTS=1), added per message: {pending['note']}"] + [
        f"    {r['mix']}, ingest batches of {r['batch']}: {r['wru_per_message']:.4f} WRU, "
        f"{r['write_calls_per_message']:.4f} calls"
        for r in pending["rows"]
    ]


def _details(doc: Mapping[str, Any]) -> list[str]:
    """Method and inputs of every figure, for the console."""
    out = ["", "method and inputs:"]
    cpu = doc["cpu_messages_per_second"]
    out.append(f"  CPU: {cpu['method']}")
    for name, d in cpu["details"].items():
        inputs = ", ".join(f"{k}={v}" for k, v in d["inputs"].items())
        out.append(
            f"    {name}: {d['messages_per_second']:,.0f}/s (runs {d['runs_per_second']}), "
            f"{d['cpu_ms_per_invocation']:.2f} ms CPU per invocation; {inputs}"
        )
        out += [f"      {line}" for line in d.get("profile", [])[:10]]
    out += [f"  CPU vs floor: {f['method']}" for f in [doc.get("cpu_vs_floor")] if f]
    counted = (doc.get("cpu_vs_floor") or {}).get("instructions")
    if counted:
        out.append(f"  instructions vs floor: {counted['method']}")
    for name, h in cpu["handlers_with_telemetry"].items():
        out.append(
            f"    {name} handler with Powertools telemetry: {h['messages_per_second']:,.0f}/s, "
            f"{h['cpu_ms_per_invocation']:.2f} ms CPU and {h['stdout_bytes_per_invocation']:.0f} B "
            "of logs per invocation"
        )
    req = doc["requests_per_message"]
    out.append(f"  requests per message: {req['units']}")
    for path, p in req["by_path"].items():
        ops = ", ".join(f"{k} {v:.4f}" for k, v in p["by_operation"].items())
        out.append(f"    {path} ({p['messages']:,} messages): {ops}")
    out += [
        f"    local stack at {local['rate_per_second']:g}/s: handlers "
        + ", ".join(f"{k} {v}" for k, v in local["all_handlers"].items())
        for local in [req.get("local_stack")]
        if local
    ]
    out += _pending_lines(req.get("pending_counts"))
    lat = doc["lateness_ms"]
    out.append(f"  lateness: {lat['source']}; {lat.get('method', '')}")
    if lat.get("rate_chosen"):
        out.append(
            f"    {lat['messages']} messages at {lat['rate_per_second']:g}/s ({lat['rate_chosen']})"
        )
    burst = doc["burst"]
    out.append(f"  burst: {burst['source']}")
    if burst.get("method"):
        out.append(f"    {burst['method']}; {burst.get('path', '')}")
    out += [f"    past its timeout: {t}" for t in burst.get("invocations_past_timeout", [])]
    model = burst["scale_out_10m"]
    for stage in model["stages"]:
        out.append(
            f"    10 M model, {stage['name']}: {stage['messages_per_second']:,.0f}/s, "
            f"{stage['seconds']:,.0f} s ({stage['bound_by']})"
        )
    out += [f"    note: {n}" for n in model["notes"]]
    probe = burst["scheduler_probe"]
    out.append(
        f"    scheduler probe ({probe['messages']:,} in one second, "
        f"{probe['send_latency_ms']:g} ms per send): "
        + "; ".join(
            f"tick {t['tick']} sent {t['sent']:,}"
            + (" and was stopped at the timeout" if t["stopped_by_timeout"] else "")
            for t in probe["ticks"]
        )
        + f"; completed: {_fmt(probe['completed'])}"
    )
    stored = doc.get("stored_item")
    if stored:
        out.append(f"  stored item: {stored['method']}")
        out.append(
            "    zlib on the JSON values, us per value / mean bytes: "
            + ", ".join(
                f"{k} {stored['compress_us'][k]} / {stored['compressed_bytes'][k]}"
                for k in stored["compress_us"]
            )
            + f"; decompress {stored['decompress_us']} us"
        )
    memory = doc.get("emitter_memory")
    if memory:
        out.append(f"  emitter memory: {memory['method']}")
        if memory.get("stages_rss_mb"):
            out.append(
                "    RSS by stage (MB): "
                + ", ".join(f"{k} {v}" for k, v in memory["stages_rss_mb"].items())
            )
        out += [f"    note: {n}" for n in memory.get("notes", [])]
    details = doc["cost_usd_per_million"]["details"]
    out.append(f"  cost model, this design (prices of {details['prices_as_of']}):")
    for line in details["designs"]["this_design"]["lines"]:
        out.append(f"    {line['usd_per_million']:8.4f}  {line['component']}: {line['detail']}")
    for line in details["designs"]["this_design"]["outside_price_list"]:
        out.append(
            f"   ({line['usd_per_million']:8.4f}) {line['component']} (outside the list): "
            f"{line['detail']}"
        )
    out.append(
        "    sensitivity: "
        + "; ".join(f"{v['variant']} ${v['usd_per_million']:.2f}" for v in details["sensitivity"])
    )
    out.append(
        "    offloaded values (S3 claim-check, kept until the lifecycle expires them): "
        + "; ".join(
            f"{p['value_bytes'] // 1024} KiB +${p['usd_per_million']:.2f} per million "
            f"(storage {p['retention_days']} days ${p['storage_usd_per_million']:.2f}, "
            f"requests ${p['requests_usd_per_million']:.2f})"
            for p in details["offloaded_payload"]
        )
    )
    return out


def write(doc: Mapping[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write bench.json and bench.md; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "bench.json"
    md_path = out_dir / "bench.md"
    json_path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    md_path.write_text(markdown(doc))
    return json_path, md_path


def _fairness_rows(fairness: Mapping[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Bystander and burst lateness before and after the tenant features."""
    rows: list[tuple[str, str, str, str, str]] = []
    local = fairness.get("local")
    if local:
        rows.extend(_local_fairness_rows(local))
    aws = fairness.get("aws_scale")
    if aws:
        for goal in aws["goals"]:
            lifted = "" if goal["met"] or goal["lifts"] == "-" else f"; lifted by {goal['lifts']}"
            rows.append(
                (
                    f"fairness (10 M in AWS): {goal['name']} (ms)",
                    _fmt(goal["figure_ms"], 0),
                    f"<= {_fmt(goal['goal_ms'], 0)}",
                    _verdict(goal["met"]),
                    f"simulated at AWS scale; bound by {goal['bound_by']}{lifted}",
                )
            )
    return rows


def _local_fairness_rows(local: Mapping[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The local stack's phases (the burst's row needs the 'after' phase)."""
    by, burst = local["bystander_p99_ms"], local["burst_p99_ms"]
    rows = [
        (
            "fairness (local): bystander p99 before / after (ms)",
            f"{_fmt(by['before'], 0)} / {_fmt(by['after'], 0)}",
            f"after <= {_fmt(local['goal_bystander_p99_ms'], 0)}",
            _verdict(local.get("met")),
            local["source"],
        )
    ]
    after = local["phases"].get("after")
    if after is not None:
        capped = after["burst"]
        rows.append(
            (
                "fairness (local): burst p99 from release before / after (ms); max per "
                "release second / per emitted second; early",
                f"{_fmt(burst['before'], 0)} / {_fmt(burst['after'], 0)}; "
                f"{capped['max_per_release_second']} / {capped['max_per_second']}; "
                f"{capped['early']}",
                "cap kept, 0 early",
                _verdict(bool(capped["cap_respected"]) and capped["early"] == 0),
                local["source"],
            )
        )
    return rows
