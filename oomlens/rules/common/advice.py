"""What to capture next time, said the same way by every rule and by the report."""

from __future__ import annotations

CAPTURE_SNAPSHOT = (
    "an allocator snapshot at the OOM: run the job under python -m oomlens.capture (it dumps "
    "one per rank the moment the allocator gives up), or call "
    "torch.cuda.memory._record_memory_history(max_entries=100000) at start and dump "
    "torch.cuda.memory._snapshot() from an out-of-memory observer "
    "(torch._C._cuda_attach_out_of_memory_observer)"
)


CAPTURE_MEMORY_SERIES = (
    "memory after every step: run the job under python -m oomlens.capture (it records it per "
    "rank), or log torch.cuda.memory_allocated() and memory_reserved() each step (DeepSpeed: "
    'see_memory_usage(..., force=True), or "memory_breakdown": true)'
)


CAPTURE_CONFIG = (
    "the ds_config.json the job ran with (python -m oomlens.capture records it as DeepSpeed "
    'resolved it; or set "log_level": "info" so DeepSpeed prints it)'
)


CAPTURE_KERNEL = (
    "the node's kernel log for the job's time: run the job under python -m oomlens.capture "
    "(it records the cgroup's OOM kills and, where readable, the kernel's lines), or "
    "dmesg -T | grep -i -E 'killed process|oom' "
    "(or the scheduler's record, e.g. sacct -j JOBID -o JobID,State,MaxRSS)"
)


CAPTURE_RANK_OUTPUT = (
    "the failed rank's own stderr, where its traceback went: torchrun prints it on the console "
    "unless --redirects or --tee sent it to files (then under --log-dir, "
    "<log-dir>/<run-id>_*/attempt_<n>/<local-rank>/stderr.log); decorating the entry point with "
    "@record (from torch.distributed.elastic.multiprocessing.errors import record) makes "
    "torchrun write it to an error file and quote it in its failure table"
)
