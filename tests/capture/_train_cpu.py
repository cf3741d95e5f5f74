"""A small deterministic CPU training loop the capture tests run, with and without capture.

Prints the final loss exactly (repr), so two runs can be compared.  Options (argv):
``--steps N``, ``--sleep S`` (per step), ``--workers N`` (DataLoader worker processes, forked),
``--fail`` (raise at the end), ``--exit N`` (sys.exit(N) at the end), ``--install`` (call
``oomlens.capture.install()`` itself), ``--hold-mb N`` (keep N MiB per step alive: host memory
growth), ``--deepspeed-config`` (build a DeepSpeedConfig, as DeepSpeed does at initialisation).
"""

import sys
import time

args = sys.argv[1:]


def opt(name, default):
    return type(default)(args[args.index(name) + 1]) if name in args else default


if "--install" in args:
    import oomlens.capture

    oomlens.capture.install()

import torch  # noqa: E402

torch.manual_seed(0)
steps, sleep, workers = opt("--steps", 12), opt("--sleep", 0.0), opt("--workers", 0)
hold = opt("--hold-mb", 0)
print("argv", sys.argv[1:], flush=True)

if "--deepspeed-config" in args:
    from deepspeed.runtime.config import DeepSpeedConfig

    DeepSpeedConfig(
        {
            "train_batch_size": 8,
            "train_micro_batch_size_per_gpu": 8,
            "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 10_000_000_000},
            "bf16": {"enabled": True},
        }
    )

data = torch.utils.data.TensorDataset(torch.randn(256, 32), torch.randn(256, 1))
loader = torch.utils.data.DataLoader(data, batch_size=32, num_workers=workers)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
kept = []
step = 0
while step < steps:
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if hold:
            kept.append(bytearray(hold * 1024 * 1024))
            for i in range(0, len(kept[-1]), 4096):
                kept[-1][i] = 1
        if sleep:
            time.sleep(sleep)
        if step >= steps:
            break
print("final loss", repr(loss.item()), flush=True)
if "--fail" in args:
    raise RuntimeError("boom at the end")
if "--exit" in args:
    sys.exit(opt("--exit", 0))
