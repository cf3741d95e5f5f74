"""A silent death whose config alone needs more host memory than the node has: the ZeRO memory
model's host account is evidence of a host kill, and the fix names the memory that fits."""

from __future__ import annotations

import functools

from oomlens.report import Report
from oomlens.session import AnalysisOptions, analyze
from tests._corpus import case_dir, manifest

GiB = 2**30


@functools.cache
def _without_kernel_log(host_memory: int) -> Report:
    # the log and config only: what a user has when dmesg is out of reach
    case = case_dir("pinned_memory_exhaustion")
    return analyze(
        [case / "train.log", case / "ds_config.json"],
        options=AnalysisOptions(host_memory=host_memory),
    )


def _cap() -> int:
    cap = manifest("pinned_memory_exhaustion")["measured"]["cgroup"]["memory.max"]
    return int(cap)


def test_the_host_account_over_the_nodes_memory_supports_the_host_kill() -> None:
    report = _without_kernel_log(_cap())  # the cgroup's memory.max the run had
    host = next(d for d in report.diagnoses if d.id == "host_oom_killed")
    cited = [e for e in host.evidence if e.text.startswith("ZeRO memory model:")]
    assert cited and cited[0].supports and cited[0].source is not None
    assert "of host memory needed per node" in cited[0].text
    more = host.fixes[0]
    assert more.arguments.get("--mem", "").endswith("G")
    gib = int(more.arguments["--mem"][:-1])
    assert gib * GiB > _cap()  # more than the node had: the model's need with its margin
    pinned = next(d for d in report.diagnoses if d.id == "pinned_memory_exhaustion")
    assert any(e.text.startswith("ZeRO memory model:") for e in pinned.evidence)


def test_an_account_that_fits_adds_nothing() -> None:
    # the same run on a 512 GiB node: the model's account fits; it rules nothing out either
    # (data loaders and copies come on top), so the silent death keeps its own confidence
    over = _without_kernel_log(_cap())
    fits = _without_kernel_log(512 * GiB)
    host_over = next(d for d in over.diagnoses if d.id == "host_oom_killed")
    host_fits = next(d for d in fits.diagnoses if d.id == "host_oom_killed")
    assert not any(e.text.startswith("ZeRO memory model:") for e in host_fits.evidence)
    assert host_fits.confidence < host_over.confidence
    assert "--mem" not in host_fits.fixes[0].arguments
