"""Model states (parameters, gradients, optimizer states): their share of a snapshot, OOMs
known only from a snapshot, and the ZeRO memory model's verdict and patches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from oomlens.diagnosis import Evidence, EvidenceKind, Fix
from oomlens.facts.config import EffectiveDsConfig
from oomlens.facts.log import (
    OomKind,
)
from oomlens.facts.memory_model import CapacityVerdict
from oomlens.facts.oom_balance import LARGEST_DEVICE_BYTES, ROUNDING_BYTES
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import DeviceAnalysis, MemoryCategory, SnapshotAnalysis
from oomlens.rules.common.evidence import size, snapshot_evidence
from oomlens.rules.common.fit import states_certainly_exceed

MODEL_STATE_CATEGORIES = frozenset(
    {MemoryCategory.PARAMETERS, MemoryCategory.GRADIENTS, MemoryCategory.OPTIMIZER_STATE}
)


def live_bytes(device: DeviceAnalysis, categories: Iterable[MemoryCategory]) -> int:
    wanted = set(categories)
    return sum(c.bytes for c in device.live_by_category if c.category in wanted)


def category_share(device: DeviceAnalysis, categories: Iterable[MemoryCategory]) -> float:
    allocated = device.state.allocated_bytes
    return live_bytes(device, categories) / allocated if allocated else 0.0


def effective_config(facts: RunFacts) -> EffectiveDsConfig | None:
    return facts.config.reading.effective if facts.config is not None else None


@dataclass(frozen=True, slots=True)
class SnapshotOom:
    """An OOM known only from a snapshot's ``oom`` trace entry (no log says it).

    ``limit`` is what the process could use, estimated from the snapshot alone: its reserved
    bytes, plus the device's free bytes when those were below the request (no per-process cap:
    the device itself was full).  ``device_exhausted`` says which case it was.
    """

    snapshot: SnapshotAnalysis
    device: DeviceAnalysis
    request: int
    allocated: int
    reserved: int
    reserved_unallocated: int
    device_free: int | None

    @property
    def device_exhausted(self) -> bool:
        return self.device_free is not None and self.device_free < self.request

    @property
    def limit(self) -> int:
        extra = self.device_free if self.device_exhausted and self.device_free else 0
        return self.reserved + extra

    def larger_than_card(self, card: int | None) -> bool:
        """The request alone exceeds the card: ``card`` (the user's ``--gpu-memory``) when
        known, else the most memory any accelerator has.  The snapshot records what was free,
        not the card's size: above free + reserved, a request might still fit a card others
        shared, but not one above every card."""
        bound = card if card else LARGEST_DEVICE_BYTES
        return self.request > bound + ROUNDING_BYTES

    def where(self) -> str:
        oom = self.device.oom
        site = oom.site.describe() if oom is not None and oom.site is not None else "unknown site"
        return f"device {self.device.device}, request from {site}"


def snapshot_ooms(facts: RunFacts) -> list[SnapshotOom]:
    """Snapshot OOMs that no log OOM event accounts for (a snapshot without its log)."""
    if any(e.message.kind is OomKind.ALLOCATOR for e in facts.gpu_oom_events()):
        return []
    found = []
    for snapshot, device in facts.snapshot_devices():
        oom = device.oom
        if oom is None:
            continue
        state = device.state
        found.append(
            SnapshotOom(
                snapshot=snapshot,
                device=device,
                request=oom.alloc_size_bytes,
                allocated=state.allocated_bytes + state.private_pool_free_bytes,
                reserved=state.reserved_bytes,
                reserved_unallocated=state.reserved_unallocated_bytes,
                device_free=oom.device_free_bytes,
            )
        )
    return found


def snapshot_oom_evidence(s: SnapshotOom, note: str = "") -> Evidence:
    oom = s.device.oom
    category = oom.category if oom is not None else MemoryCategory.UNKNOWN
    what = "" if category is MemoryCategory.UNKNOWN else f" ({category.value.replace('_', ' ')})"
    return snapshot_evidence(
        s.snapshot,
        f"oom entry on {s.where()}: {size(s.request)} needed{what}; "
        f"{size(s.allocated)} allocated, {size(s.reserved_unallocated)} reserved but unallocated, "
        f"{size(s.device_free)} free on the device",
        note,
    )


def model_overflow(facts: RunFacts, kind: str = "gpu") -> tuple[Evidence, CapacityVerdict] | None:
    """The memory model's verdict for ``kind`` (``gpu``: one card; ``host``: one node's
    memory) when it says the config cannot fit it."""
    model = facts.memory_model
    if model is None:
        return None
    verdict = model.verdict(kind)
    if verdict is None or verdict.overflow_bytes <= 0:
        return None
    blamed = verdict.overflow_component
    text = (
        f"ZeRO memory model: {size(verdict.required_bytes)} "
        + ("needed per GPU" if kind == "gpu" else "of host memory needed per node")
        + f" at its peak ({verdict.peak_phase}) vs {size(verdict.capacity_bytes)} "
        f"({verdict.capacity_source}); first overflow at {verdict.overflow_phase}"
        + (f", largest allocation there: {blamed.name} {size(blamed.bytes)}" if blamed else "")
    )
    source = facts.params.source if facts.params is not None else None
    note = (
        f"for {facts.params.total:,} parameters ({facts.params.origin}) on "
        f"{facts.world_size.value if facts.world_size else '?'} GPUs"
        if facts.params is not None
        else ""
    )
    return Evidence(EvidenceKind.DERIVED, text, source, note), verdict


def model_patch_fixes(facts: RunFacts, limit: int = 2) -> list[Fix]:
    """The memory model's best config patches as fixes, with their predicted savings."""
    model = facts.memory_model
    if model is None:
        return []
    fixes = []
    for patch in model.patches[:limit]:
        merge = patch.merge_patch()
        if not merge:
            continue
        fixes.append(
            Fix(
                patch.summary[:1].upper() + patch.summary[1:] + ".",
                config_patch=merge,
                predicted_saving_bytes=patch.gpu_bytes_saved,
                cost=patch.cost,
            )
        )
    return fixes


def states_account_evidence(facts: RunFacts, *, supports: bool) -> Evidence | None:
    """The account's proof that the model states alone exceed the limit (None when it has
    none): the fewest bytes they take with nothing assumed, against the limit."""
    account = facts.account
    if account is None or account.limit is None or not states_certainly_exceed(account):
        return None
    states = account.states_at_least or 0
    peak = account.states_at_peak
    return Evidence(
        EvidenceKind.DERIVED,
        f"the model states need at least {size(states)} once they all exist "
        f"({peak.source if peak is not None else 'the account'}), over the {size(account.limit)} "
        f"limit ({account.limit_source})",
        None,
        "no batch fits: the states alone exceed the limit"
        if supports
        else "the model states alone exceed the limit: a smaller batch cannot fit",
        supports=supports,
    )
