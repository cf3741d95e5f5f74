#!/usr/bin/env python3
"""Do oomlens's fixes make the failed runs complete?  Re-run each OOM scenario of
``fixtures/crash_logs`` with its top fix applied by ``oomlens fix --write``, on the GPU, under
the same memory cap, and compare the run's peak with the fix's predicted peak.

Three steps:

``plan`` (here, on the CPU): for every OOM case (expected verdict gpu_oom / host_oom; the
``_captured`` twins are the same scenarios and are left out), ``oomlens fix CASE --command
<the case's command> --write OUT/<case>`` and a plan entry: the fix, whether it could be applied
to the command (its config patch, environment or arguments), the rewritten command with the
patched config placed where the GPU run reads it, the predicted peak.  A fix that is outside
the run (stop another process) is applied as the scenario allows: the run without the process
that held the card.

``run`` (on the GPU machine, from the repository root, as root): the scenario driver's work
directory and DeepSpeed (``fixtures/crash_logs/_scenarios/run_corpus.py``), then every planned
command in turn under the case's cap (``EMULATE_GPU_MEMORY_GIB``; a host cap through cgroup v2
where the case had one), its peak read at exit (``torch.cuda.max_memory_reserved`` and
``max_memory_allocated`` of every process, by a ``sitecustomize`` on ``PYTHONPATH``).

``report``: the table (case, diagnosis, fix, completed, peak vs predicted) and the two figures
the issue asks for: the share of re-runs that completed, and of those with a prediction, the
share within 15% of it.

Usage:
  python bench/fix_check.py plan --out bench/results/fix_check
  python bench/fix_check.py run --plan bench/results/fix_check/plan.json --out $OUT \
      --wheels ../shared/wheels [--only a,b] [--deadline-min 8]
  python bench/fix_check.py report --plan bench/results/fix_check/plan.json \
      --results DIR/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "fixtures" / "crash_logs"
SCENARIOS = CASES / "_scenarios"
GIB = 2**30
SITE = """
import atexit, json, os
def _oomlens_fix_check_peak():
    import sys
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    out = os.environ.get("OOMLENS_FIX_CHECK_PEAKS")
    if not out:
        return
    record = {"pid": os.getpid(), "rank": os.environ.get("RANK"),
              "max_memory_reserved": torch.cuda.max_memory_reserved(),
              "max_memory_allocated": torch.cuda.max_memory_allocated()}
    with open(os.path.join(out, f"peak_{os.getpid()}.json"), "w") as f:
        json.dump(record, f)
atexit.register(_oomlens_fix_check_peak)
"""


def oom_cases() -> list[dict[str, Any]]:
    found = []
    for manifest in sorted(CASES.glob("*/case.json")):
        case = json.loads(manifest.read_text())
        expected = case.get("expected", {})
        if expected.get("verdict") not in ("gpu_oom", "host_oom"):
            continue
        if manifest.parent.name.endswith("_captured"):
            continue
        found.append(case | {"name": manifest.parent.name})
    return found


def _cgroup_max(case: dict[str, Any]) -> int | None:
    match = re.search(r"memory\.max=(\d+)", case.get("emulation", ""))
    return int(match.group(1)) if match else None


SCENARIO_CONFIG_FLAG = re.compile(r"\btrain_lightning\.py\b")
"""Scenario scripts that build their DeepSpeed config from flags and take a file instead as
``--deepspeed-config`` (``DeepSpeedStrategy(config=...)`` in ``train_lightning.py``)."""


def plan(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for case in oom_cases():
        name = case["name"]
        target = out / name
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "oomlens",
                "fix",
                str((CASES / name).relative_to(ROOT)),
                "--command",
                case["command"],
                "--write",
                str(target.relative_to(ROOT)),
            ],
            cwd=ROOT,  # paths in the plan relative to the checkout, not this machine's
            capture_output=True,
            text=True,
            timeout=300,
        )
        record = json.loads((target / "fix.json").read_text()) if done.returncode == 0 else {}
        command = record.get("command") or case["command"]
        patched = target / "ds_config.json"
        if patched.exists():
            # the GPU run reads it from the work directory's fixes/ folder
            command = command.replace(str(patched.relative_to(ROOT)), f"fixes/{name}.json")
            if f"fixes/{name}.json" not in command and SCENARIO_CONFIG_FLAG.search(command):
                # the run had no config file: the scenario script takes one as this flag
                command += f" --deepspeed-config fixes/{name}.json"
        applied = bool(record.get("config_patch") or record.get("environment")) or (
            bool(record.get("arguments")) and command != case["command"]
        )
        external = record.get("diagnosis") == "other_process"
        entries.append(
            {
                "case": name,
                "expected": case["expected"].get("diagnosis"),
                "diagnosis": record.get("diagnosis"),
                "fix": record.get("summary"),
                "applied": applied or external,
                "external": external,
                "original_command": case["command"],
                "command": command,
                "config": f"{name}/ds_config.json" if patched.exists() else None,
                "predicted_peak_bytes": record.get("predicted_peak_bytes"),
                "cgroup_max": _cgroup_max(case),
                "notes": record.get("notes", [])
                + ([done.stderr.strip()] if done.returncode else []),
            }
        )
        print(f"{name:34} {record.get('diagnosis')!s:24} applied={applied or external}")
    (out / "plan.json").write_text(json.dumps(entries, indent=2) + "\n")
    print(f"plan: {out / 'plan.json'}")


def _one_gpu(tokens: list[str]) -> list[str] | None:
    """The command on one GPU: torchrun's data-parallel ranks each hold the same memory (DDP
    replicates; generation is per rank), so one rank shows a rank's peak; a DeepSpeed run over
    several GPUs partitions its states by the world size, so one GPU is another run (None)."""
    out = list(tokens)
    for i, token in enumerate(out[:-1]):
        if token == "--nproc_per_node":
            out[i + 1] = "1"
        if token == "--num_gpus" and out[i + 1] != "1":
            return None
    return out


def run(
    plan_path: Path,
    out: Path,
    wheels: str,
    only: set[str],
    deadline_min: float,
    one_gpu: bool = False,
) -> None:
    sys.path.insert(0, str(SCENARIOS))
    import run_corpus as rc  # the scenario driver: work directory, DeepSpeed, cgroups

    rc.OUT = out
    out.mkdir(parents=True, exist_ok=True)
    rc.DEADLINE = None
    rc.OVERRUN_S = 60
    stop_at = time.time() + deadline_min * 60
    entries = [e for e in json.loads(plan_path.read_text()) if not only or e["case"] in only]
    installed = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True)
    if installed.returncode != 0:
        rc.install_deepspeed(wheels)
    rc.prepare_workdir()
    fixes = rc.WORK / "fixes"
    fixes.mkdir(exist_ok=True)
    site = rc.WORK / "fix_check_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for entry in entries:
        name = entry["case"]
        if name in results or not entry["applied"]:
            continue
        if time.time() > stop_at:
            rc.log(f"deadline: {name} not run")
            break
        if entry["config"]:
            config = json.loads((plan_path.parent / entry["config"]).read_text())
            if _offloads(config) and not _cpu_adam_built():
                config["zero_force_ds_cpu_optimizer"] = False
                config.setdefault("optimizer", {}).setdefault("params", {})["torch_adam"] = True
            (fixes / f"{name}.json").write_text(json.dumps(config, indent=2) + "\n")
        peaks = rc.WORK / "peaks" / name
        peaks.mkdir(parents=True, exist_ok=True)
        for old in peaks.glob("*.json"):
            old.unlink()
        tokens = shlex.split(entry["command"])
        if one_gpu:
            tokens = _one_gpu(tokens)
            if tokens is None:
                rc.log(f"{name}: needs more than one GPU (a ZeRO partition over ranks): not run")
                continue
        env = {"PYTHONPATH": str(site), "OOMLENS_FIX_CHECK_PEAKS": str(peaks)}
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
            key, value = tokens.pop(0).split("=", 1)
            env[key] = value
        info = rc.run_case(
            f"fix_{name}",
            shlex.join(tokens),
            timeout=max(30, min(300, stop_at + 60 - time.time())),
            env_extra=env,
            cgroup=entry["cgroup_max"] is not None,
            cgroup_max=entry["cgroup_max"],
            gpus="0" if one_gpu else "0,1",
        )
        records = [json.loads(p.read_text()) for p in peaks.glob("peak_*.json")]
        log_text = (rc.WORK / "runs" / f"fix_{name}" / "train.log").read_text(errors="replace")
        results[name] = {
            "exit_code": info["exit_code"],
            "timed_out": info["timed_out"],
            "wall_seconds": info["wall_seconds"],
            "out_of_memory": "out of memory" in log_text.lower(),
            "peak_reserved": max((r["max_memory_reserved"] for r in records), default=None),
            "peak_allocated": max((r["max_memory_allocated"] for r in records), default=None),
            "processes_reporting": len(records),
            "log_tail": log_text.strip().splitlines()[-3:],
        }
        results_path.write_text(json.dumps(results, indent=2) + "\n")


def _offloads(config: dict[str, Any]) -> bool:
    zero = config.get("zero_optimization", {})
    return any(
        isinstance(zero.get(k), dict) and zero[k].get("device") in ("cpu", "nvme")
        for k in ("offload_optimizer", "offload_param")
    )


def _cpu_adam_built() -> bool:
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()",
        ],
        capture_output=True,
        timeout=600,
        cwd="/tmp",
    )
    return probe.returncode == 0


def report(plan_path: Path, results_path: Path) -> None:
    entries = json.loads(plan_path.read_text())
    results = json.loads(results_path.read_text())
    rows, completed, ran, near, predicted = [], 0, 0, 0, 0
    for e in entries:
        r = results.get(e["case"])
        done = r is not None and r["exit_code"] == 0 and not r["timed_out"]
        peak, want = (r or {}).get("peak_reserved"), e["predicted_peak_bytes"]
        if r is not None:
            ran += 1
            completed += done
        within = None
        if done and peak and want:
            predicted += 1
            within = abs(peak - want) / want <= 0.15
            near += within
        outcome = "not run" if r is None else "completed" if done else f"failed ({r['exit_code']})"
        cells = [
            e["case"],
            str(e["diagnosis"]),
            "yes" if e["applied"] else "no",
            outcome,
            f"{peak / GIB:.2f} GiB" if peak else "-",
            f"{r['peak_allocated'] / GIB:.2f} GiB" if r and r.get("peak_allocated") else "-",
            f"{want / GIB:.2f} GiB" if want else "-",
            "-" if within is None else "yes" if within else "no",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    print(
        "| case | top fix for | applied | re-run | peak reserved | peak allocated | predicted "
        "| within 15% |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\nre-runs completed: {completed}/{ran}; peaks within 15% of the prediction: "
        f"{near}/{predicted}; fixes not machine-applicable: "
        f"{sum(not e['applied'] for e in entries)}/{len(entries)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fix_check")
    r = sub.add_parser("run")
    r.add_argument("--plan", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--wheels", default=str(ROOT.parent / "shared" / "wheels"))
    r.add_argument("--only", default="")
    r.add_argument("--deadline-min", type=float, default=8.0)
    r.add_argument("--one-gpu", action="store_true", help="run on one GPU (see _one_gpu)")
    q = sub.add_parser("report")
    q.add_argument("--plan", type=Path, required=True)
    q.add_argument("--results", type=Path, required=True)
    args = parser.parse_args()
    if args.step == "plan":
        plan(args.out)
    elif args.step == "run":
        run(
            args.plan,
            args.out,
            args.wheels,
            set(filter(None, args.only.split(","))),
            args.deadline_min,
            args.one_gpu,
        )
    else:
        report(args.plan, args.results)


if __name__ == "__main__":
    os.environ.setdefault("OOMLENS_NO_PROGRESS", "1")
    main()
