"""SLURM Epilog mode: analyze a failed job on its node the moment it ends, harmlessly.

``oomlens epilog`` (and ``contrib/slurm/oomlens-epilog.sh`` for ``slurm.conf``'s ``Epilog=``)
reads the job from the Epilog's environment (:mod:`.environment`), finds its output files from
sbatch's raw patterns (:mod:`.patterns`) and the snapshots/configs in its work directory
(:mod:`.inputs`), analyzes them as the job's user in a child process with a hard deadline
(:mod:`.worker`, :mod:`.analysis`), and records the result in a spool (:mod:`.spool`).  The
site's settings are one TOML file (:mod:`.settings`).  :func:`run_epilog` never raises and
returns within its budget; the command always exits 0, because a failing or late Epilog
drains the node.  :func:`sweep_spool` (``oomlens epilog --sweep``, from cron) finishes later,
without the Epilog's limits, what it deferred or cut short (:mod:`.pending`, :mod:`.sweep`).
"""

from oomlens.epilog.runner import EpilogOutcome, run_epilog
from oomlens.epilog.settings import DEFAULT_SETTINGS_PATH, EpilogSettings, load_settings
from oomlens.epilog.sweep import SweepOutcome, SweepRun, sweep_spool

__all__ = [
    "DEFAULT_SETTINGS_PATH",
    "EpilogOutcome",
    "EpilogSettings",
    "SweepOutcome",
    "SweepRun",
    "load_settings",
    "run_epilog",
    "sweep_spool",
]
