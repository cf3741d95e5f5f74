"""The JSON report: a documented, versioned schema (docs/json-schema.md).

``report_to_dict`` is the contract other tools build on (``oomlens triage``, the SLURM epilog,
ticket bots): keys are only ever added within a major ``schema_version``; a removal or a change
of meaning bumps it.  Sizes are bytes (integers); confidences are 0..1; times are ISO 8601.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from oomlens.facts import SourceRef
from oomlens.facts.account import AccountTerm, MemoryAccount
from oomlens.facts.context import RunContext
from oomlens.facts.log import OomEvent
from oomlens.facts.memory_model import CapacityVerdict, Device
from oomlens.facts.ranks import RankStatus
from oomlens.render.registry import Format, Renderer, RenderOptions
from oomlens.render.whatif import whatif_to_dict
from oomlens.report import (
    CHECK_SCHEMA_VERSION,
    SCHEMA_VERSION,
    CheckReport,
    Diagnosis,
    Evidence,
    Fix,
    Report,
    WhatIfReport,
)
from oomlens.untrusted import strip_controls, without_surrogates

if TYPE_CHECKING:
    from oomlens.render.registry import Document

MAX_OOM_EVENTS = 64
"""Bound on ``oom_events`` (a run of 1,000 ranks each printing its OOM); the count is kept."""


def _source(ref: SourceRef | None) -> dict[str, Any] | None:
    if ref is None:
        return None
    return {"path": ref.path, "line": ref.line, "rank": ref.rank, "host": ref.host}


def _evidence(item: Evidence) -> dict[str, Any]:
    return {
        "kind": item.kind.value,
        "text": item.text,
        "source": _source(item.source),
        "note": item.note,
        "supports": item.supports,
    }


def _fix(item: Fix) -> dict[str, Any]:
    return {
        "summary": item.summary,
        "config_patch": _plain(item.config_patch) if item.config_patch is not None else None,
        "environment": dict(item.environment),
        "command": item.command,
        "predicted_saving_bytes": item.predicted_saving_bytes,
        "cost": item.cost,
        "arguments": dict(item.arguments),
        "predicted_peak_bytes": item.predicted_peak_bytes,
    }


def _term(item: AccountTerm) -> dict[str, Any]:
    return {
        "term": item.term.value,
        "bytes": item.bytes,
        "low": item.low,
        "high": item.high,
        "basis": item.basis.value,
        "source": item.source,
        "note": item.note,
    }


def account_to_dict(account: MemoryAccount | None) -> dict[str, Any] | None:
    """The memory account of the first GPU OOM (``oomlens.facts.account``), None without one."""
    if account is None:
        return None
    return {
        "rank": account.rank,
        "device": account.device,
        "phase": account.phase,
        "limit": account.limit,
        "limit_source": account.limit_source,
        "limit_is_cap": account.limit_is_cap,
        "needed": account.needed,
        "terms": [_term(t) for t in account.terms],
        "states_at_peak": _term(account.states_at_peak)
        if account.states_at_peak is not None
        else None,
    }


def context_to_dict(context: RunContext) -> dict[str, Any]:
    """The run's context (``oomlens.facts.context``): each known value with how sure it is,
    how it was read and where."""
    return {
        value.key.value: {
            "value": value.value,
            "certainty": value.certainty.value,
            "origin": value.origin,
            "source": _source(value.source),
            "text": value.text,
        }
        for value in context
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def diagnosis_to_dict(d: Diagnosis) -> dict[str, Any]:
    return {
        "id": d.id,
        "title": d.title,
        "severity": d.severity.label,
        "confidence": round(d.confidence, 3),
        "summary": d.summary,
        "rank": d.rank,
        "evidence": [_evidence(e) for e in d.evidence],
        "fix": [_fix(f) for f in d.fixes],
        "missing": list(d.missing),
        "figures": {name: _plain(figure.value) for name, figure in d.figures.items()},
    }


def oom_event_to_dict(event: OomEvent) -> dict[str, Any]:
    m = event.message
    return {
        "rank": event.rank,
        "local_rank": event.local_rank,
        "host": event.source.host,
        "device": m.device,
        "phase": event.phase.value,
        "phase_evidence": event.phase_evidence,
        "source": event.source.path,
        "line": event.source.line,
        "origin": event.origin,
        "timestamp": event.timestamp.isoformat() if event.timestamp else None,
        "kind": m.kind.value,
        "message_format": m.message_format,
        "exception_class": m.exception_class,
        "certain": m.certain,
        "complete": m.complete,
        "tried_to_allocate": m.tried_to_allocate,
        "total_capacity": m.total_capacity,
        "free": m.free,
        "process_in_use": m.process_in_use,
        "allocated_by_pytorch": m.allocated_by_pytorch,
        "reserved_unallocated": m.reserved_unallocated,
        "reserved_total": m.reserved_total,
        "allowed": m.allowed,
        "private_pools": m.private_pools,
        "other_allocations": m.other_allocations,
        "backend": m.backend,
        "this_process_pid": m.listed_self.pid if m.listed_self is not None else None,
        "preamble": event.preamble,
        "other_processes": [{"pid": p.pid, "bytes": p.bytes} for p in m.other_processes],
    }


def _rank(status: RankStatus) -> dict[str, Any]:
    return {
        "rank": status.rank,
        "outcome": status.outcome,
        "own_failure": status.own_failure,
        "died_because_of_peer": status.died_because_of_peer,
        "peer_evidence": status.peer_evidence,
        "exitcode": status.exitcode,
        "signal": status.signal,
        "first_time": status.first_time.isoformat() if status.first_time else None,
        "first_source": _source(status.first_source),
        "attributed": status.attributed,
    }


def report_to_dict(report: Report) -> dict[str, Any]:
    """The report as JSON-ready builtins (see the module docstring for the contract)."""
    facts = report.facts
    picture = facts.ranks
    events = facts.oom_events()
    caught = facts.caught_oom_events()
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "oomlens_version": report.oomlens_version,
        "verdict": report.verdict.value,
        "verdict_reason": report.verdict_reason,
        "diagnoses": [diagnosis_to_dict(d) for d in report.diagnoses],
        "oom_events": [oom_event_to_dict(e) for e in events[:MAX_OOM_EVENTS]],
        "oom_events_total": len(events),
        "caught_oom_events": [oom_event_to_dict(e) for e in caught[:MAX_OOM_EVENTS]],
        "ranks": {
            "first_failed": picture.first_failed.rank if picture.first_failed else None,
            "basis": picture.basis,
            "peer_victims": list(picture.peer_victims),
            "timed_out": list(picture.timed_out_ranks),
            "suspected_stragglers": list(picture.suspected_stragglers),
            "same_time": list(picture.same_time),
            "unranked_run": picture.unranked_run,
            "ranks": [_rank(s) for s in picture.ranks],
        },
        "run": {
            "world_size": facts.world_size.value if facts.world_size else None,
            "world_size_origin": facts.world_size.origin if facts.world_size else None,
            "last_step": facts.last_step,
            "config_origin": facts.config.origin if facts.config else None,
            "snapshots": len(facts.snapshots),
        },
        "account": account_to_dict(facts.account),
        "context": context_to_dict(facts.context),
        "missing_evidence": list(report.missing),
        "inputs": [
            {
                "path": i.path,
                "kind": i.kind,
                "detail": i.detail,
                "problem": i.problem,
                "notes": list(i.notes),
                "rank": i.rank,
            }
            for i in facts.inputs
        ],
    }
    stripped: dict[str, Any] = _stripped(document)
    return stripped


def _stripped(value: Any) -> Any:
    """``value`` with every string cleaned of control and bidi characters (log text ends up in
    terminals and pages that read this JSON) and its surrogates escaped (``without_surrogates``:
    a file name that is not UTF-8, a config's lone ``"\\ud800"``; the document is UTF-8 and
    no reader gets a lone surrogate); keys included."""
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, dict):
        return {_clean(str(k)): _stripped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_stripped(item) for item in value]
    return value


def _clean(text: str) -> str:
    return without_surrogates(strip_controls(text))


def render_json(report: Report) -> str:
    return RENDERER.render(report, RenderOptions())


def check_to_dict(check: CheckReport) -> dict[str, Any]:
    """``oomlens check``'s report as JSON-ready builtins (versioned like the analysis's)."""
    result = check.preflight

    def verdict(v: CapacityVerdict) -> dict[str, Any]:
        return {
            "kind": v.kind,
            "capacity_bytes": v.capacity_bytes,
            "required_bytes": v.required_bytes,
            "headroom_bytes": v.headroom_bytes,
            "fits": v.fits,
            "peak_phase": v.peak_phase,
            "overflow_component": v.overflow_component.code if v.overflow_component else None,
            "overflow_phase": v.overflow_phase,
            "overflow_bytes": v.overflow_bytes,
        }

    payload: dict[str, Any] = {
        "schema_version": CHECK_SCHEMA_VERSION,
        "oomlens_version": check.oomlens_version,
        "config": result.document.path,
        "validator": result.validator,
        "valid": result.valid,
        "problems": [
            {
                "key_path": p.key_path,
                "code": p.code,
                "message": p.message,
                "line": p.source.line if p.source else None,
            }
            for p in result.problems
        ],
        "effective": {k: v for k, v in result.effective.settings().items() if _json_safe(v)},
        "batch": None
        if result.batch is None
        else {
            "ok": result.batch.ok,
            "error": result.batch.error,
            "derived": None
            if result.batch.derived is None
            else {
                "train_batch_size": result.batch.derived.train_batch_size,
                "train_micro_batch_size_per_gpu": result.batch.derived.micro_batch_per_gpu,
                "gradient_accumulation_steps": result.batch.derived.gradient_accumulation_steps,
            },
            "corrections": [c.patch.merge_patch() for c in result.batch.corrections],
        },
        "budget": None
        if result.budget is None
        else {
            "gpu_peak_bytes": result.budget.gpu_peak_bytes,
            "host_peak_bytes": result.budget.host_peak_bytes,
            "pinned_per_host_bytes": result.budget.pinned_per_host(),
            "components": [
                {
                    "code": c.code,
                    "device": c.device.value,
                    "phase": c.phase.value,
                    "bytes": c.bytes,
                    "per": "host" if c.per_host else ("gpu" if c.device is Device.GPU else "rank"),
                    "pinned": c.pinned,
                    "basis": c.basis.value,
                    "formula": c.formula,
                    "key_paths": list(c.key_paths),
                }
                for c in result.budget.components
            ],
        },
        "verdicts": [verdict(v) for v in result.verdicts],
        "hazards": [
            {
                "code": h.code,
                "severity": h.severity.value,
                "message": h.message,
                "key_paths": list(h.key_paths),
            }
            for h in result.hazards
        ],
        "patches": [
            {
                "summary": p.summary,
                "merge_patch": p.merge_patch(),
                "gpu_bytes_saved": p.gpu_bytes_saved,
                "host_bytes_delta": p.host_bytes_delta,
                "pinned_bytes_delta": p.pinned_bytes_delta,
                "cost": p.cost,
            }
            for p in result.patches
        ],
        "notes": list(result.notes),
        "failed": result.failed,
    }
    return payload


def check_error_json(config: str, message: str, exit_code: int, oomlens_version: str) -> str:
    """``oomlens check --format json``'s document for a config it could not read: the same
    keys a reader tests first (``valid``, ``failed``), with ``error`` saying what went wrong
    (its one line, as on stderr) and the exit code the command ends with."""
    payload = {
        "schema_version": CHECK_SCHEMA_VERSION,
        "oomlens_version": oomlens_version,
        "config": config,
        "valid": False,
        "failed": True,
        "error": {"message": message, "exit_code": exit_code},
    }
    return json.dumps(_stripped(payload), indent=2, ensure_ascii=False) + "\n"


def _json_safe(value: object) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


class JsonRenderer(Renderer):
    format: ClassVar[Format] = Format.JSON

    def render(self, document: Document, options: RenderOptions) -> str:
        data: dict[str, Any]
        if isinstance(document, CheckReport):
            data = _stripped(check_to_dict(document))
        elif isinstance(document, WhatIfReport):
            data = _stripped(whatif_to_dict(document))
        else:
            data = report_to_dict(document)
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


RENDERER = JsonRenderer()
