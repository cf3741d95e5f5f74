"""The job array documented in docs/triage.md, run on a real one-node SLURM cluster: its merged
table is the table of one triage over the whole archive."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pandas.testing
import pytest

from oomlens.triage.engine import TriageOptions, triage
from oomlens.triage.outputs import read_table
from tests.slurm.cluster import SlurmCluster, install_packages, why_not_runnable
from tests.triage._trees import BASE_TIME, copy_case

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "triage.md"
CASES = (
    "prefetch_overshoot",
    "fragmentation",
    "nccl_timeout",
    "memory_leak_fixed",
    "other_process",
)


def _bash_block_after(text: str, marker: str) -> str:
    start = text.index("```bash\n", text.index(marker)) + len("```bash\n")
    return text[start : text.index("```", start)]


def test_the_documented_job_array_triages_like_one_run(tmp_path: Path) -> None:
    reason = why_not_runnable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the real-SLURM test: {reason}")
        pytest.skip(reason)
    install_packages()
    # GIVEN an archive and the docs' array script and submission, scaled to this small node
    archive = tmp_path / "train-runs"
    for n, case in enumerate(CASES):
        copy_case(case, archive / case, moment=BASE_TIME + 60 * n)
    state = tmp_path / "triage"
    docs = DOCS.read_text()
    script = _bash_block_after(docs, "`triage-array.sbatch`:")
    assert '--shard "$K/$N"' in script
    script = script.replace("--cpus-per-task=8", "--cpus-per-task=1").replace(
        "--mem=16G", "--mem=500M"
    )
    submit = _bash_block_after(docs, "Submit the array")
    assert "\nN=8\n" in submit
    submit = (
        submit.replace("/shared/train-runs", str(archive))
        .replace("/shared/triage", str(state))
        .replace("\nN=8\n", "\nN=3\n")
    )
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "triage-array.sbatch").write_text(script)
    # munged runs as the munge user: its directory must be reachable (pytest's tmp is 0700)
    cluster_dir = Path(tempfile.mkdtemp(prefix="oomlens-slurm-"))
    cluster_dir.chmod(0o755)
    cluster = SlurmCluster(cluster_dir)
    environment = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(REPO),
    }
    try:
        cluster.start()
        # WHEN it is submitted as the docs say, and every job has left the queue
        merge_job = cluster.run(["bash", "-euc", submit], cwd=jobs, extra_env=environment)
        merge_id = merge_job.strip().splitlines()[-1]
        array_id = str(int(merge_id) - 1)
        cluster.wait_until_gone([array_id, merge_id], timeout=300)
        states = cluster.job_states(array_id) + cluster.job_states(merge_id)
    finally:
        cluster.stop()
        shutil.rmtree(cluster_dir, ignore_errors=True)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(jobs.glob("*.out")))
    # THEN the three tasks and the merge succeeded
    assert states == ["COMPLETED 0:0"] * 4, logs
    assert sorted(p.name for p in (state / "stores").iterdir() if p.suffix == ".sqlite") == [
        f"shard-{k}-of-3.sqlite" for k in (1, 2, 3)
    ]
    # AND the merged table is the one a single triage over the archive makes
    single = triage(
        [str(archive)], TriageOptions(jobs=2, store=None, reports_dir=str(state / "reports"))
    ).table
    pandas.testing.assert_frame_equal(read_table(str(state / "runs.csv")), single)
    assert (state / "index.html").is_file()
