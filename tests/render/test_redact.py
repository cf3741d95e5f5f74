"""``--redact``: user names, home paths, host names and IP addresses never reach any output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from oomlens.render.html import render_html
from oomlens.render.json import render_json
from oomlens.render.markdown import render_markdown
from oomlens.render.redact import Redactor, redact_report
from oomlens.render.text import render_text
from oomlens.session import AnalysisOptions, analyze
from tests._corpus import case_dir

USER = "alice.smith"
HOST = "gpu-node-17.cluster.example.com"
SHORT_HOST = "gpu-node-17"
OTHER_USER, OTHER_HOST = "bob", "login01.hpc.example.org"
IPV4, MASTER_IPV4 = "10.42.7.19", "10.42.7.1"
IPV6 = "fe80::1ff:fe23:4567:890a"
ORIGINALS = (
    USER,
    "alice",
    SHORT_HOST,
    "cluster.example.com",
    OTHER_HOST,
    "login01",
    IPV4,
    MASTER_IPV4,
    IPV6,
)


def named_run(root: Path) -> Path:
    """The corpus' nccl_timeout run, moved under a home directory, its host renamed, every line
    given the pdsh host prefix, and the network lines a real cluster prints appended."""
    run = root / "home" / USER / "runs" / "job-42"
    run.mkdir(parents=True)
    source = (case_dir("nccl_timeout") / "train.log").read_text()
    source = source.replace("/home/user/", f"/home/{USER}/").replace("localhost", HOST)
    lines = [f"{SHORT_HOST}: {line}" for line in source.splitlines()]
    lines += [
        f"{SHORT_HOST}:2183:2183 [0] NCCL INFO Bootstrap : Using eth0:{IPV4}<0>",
        f"{SHORT_HOST}: MASTER_ADDR={MASTER_IPV4} MASTER_PORT=29500 USER={USER}",
        f"{SHORT_HOST}: connecting to [{IPV6}]:29500 from {HOST}",
        f"{SHORT_HOST}: ssh {OTHER_USER}@{OTHER_HOST}: connection refused",
        f"{SHORT_HOST}: checkpoint dir ~{USER}/ckpt and /scratch/{USER}/run",
    ]
    (run / "train.log").write_text("\n".join(lines) + "\n")
    return run


def test_unredacted_reports_do_carry_the_names(tmp_path: Path) -> None:
    """The generated run really puts the names in the reports (else redaction proves nothing)."""
    html = render_html(analyze([named_run(tmp_path)]))
    for original in (USER, SHORT_HOST, IPV4, IPV6, OTHER_HOST):
        assert original in html, original


def test_no_original_survives_in_any_format(tmp_path: Path) -> None:
    report = redact_report(analyze([named_run(tmp_path)]))
    outputs = {
        "text": render_text(report),
        "json": render_json(report),
        "markdown": render_markdown(report, redacted=True),
        "html": render_html(report, redacted=True),
    }
    for fmt, output in outputs.items():
        for original in ORIGINALS:
            assert original not in output, (fmt, original)
            assert original.lower() not in output.lower(), (fmt, original)
    # the placeholders are consistent: the host of the torchrun summary is host1 everywhere
    data = json.loads(outputs["json"])
    hosts = {r["first_source"]["host"] for r in data["ranks"]["ranks"] if r["first_source"]}
    assert hosts <= {"host1", None}
    assert re.search(r"/home/user\d+/runs/job-42/train\.log", outputs["html"])
    assert "host1" in outputs["markdown"] and "ip1" in outputs["html"]
    assert "Redacted" in outputs["html"]


def test_cli_redacts_every_output_it_writes(tmp_path: Path) -> None:
    run = named_run(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "oomlens",
            "analyze",
            str(run),
            "--redact",
            "-o",
            str(tmp_path / "r.json"),
            "--html",
            str(tmp_path / "r.html"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    for name in ("r.json", "r.html"):
        written = (tmp_path / name).read_text()
        for original in ORIGINALS:
            assert original not in written, (name, original)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('File "/home/alice/proj/train.py", line 3', 'File "/home/user1/proj/train.py", line 3'),
        ("/Users/alice/x and /scratch/alice/y", "/Users/user1/x and /scratch/user1/y"),
        ("C:\\Users\\alice\\x.py", "C:\\Users\\user1\\x.py"),
        ("ssh alice@node-a.example.com", "ssh user1@host1"),
        ("from 10.0.0.5 to 10.0.0.5:29500", "from ip1 to ip1:29500"),
        ("[fe80::1ff:fe23:4567:890a]:29500", "[ip1]:29500"),
        ("2001:db8::8a2e:370:7334", "ip1"),
        (
            "deepspeed --world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19",
            "deepspeed --world_info=<redacted>",
        ),
    ],
)
def test_redactor_replaces_identities(text: str, expected: str) -> None:
    redactor = Redactor(include_machine=False)
    redactor.learn_text(text)
    assert redactor.text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "c10::cuda::CUDAError at 12:34:56.789",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.02 GiB",
        "deepspeed 0.19.8, torch 2.11.0+cu130, NCCL 2.28.9",
        "std::vector<at::Tensor>::operator[]",
        "GPU 0 has a total capacity of 139.80 GiB",
    ],
)
def test_redactor_leaves_technical_text_alone(text: str) -> None:
    redactor = Redactor(include_machine=False)
    redactor.learn_text(text)
    redactor.add_host("gpu")  # a host named like a word of the prose is not taken for a host
    assert redactor.text(text) == text


def test_same_original_same_placeholder_and_names_learnt_anywhere_apply_everywhere() -> None:
    redactor = Redactor(include_machine=False)
    redactor.learn({"host": "node-b.example.com", "path": "/home/carol/a"})
    assert redactor.text("node-b.example.com node-b NODE-B") == "host1 host1 host1"
    assert redactor.text("carol's job on node-b") == "user1's job on host1"
    assert redactor.text("/home/dave/x /home/carol/y") == "/home/user2/x /home/user1/y"


def test_redaction_refuses_objects_it_cannot_walk() -> None:
    with pytest.raises(TypeError):
        Redactor(include_machine=False).apply(object())


def test_redaction_walks_every_fact_of_a_full_report() -> None:
    """Snapshots, the config, the ZeRO memory model and its patches: nothing it cannot copy."""
    report = analyze(
        [case_dir("prefetch_overshoot")],
        options=AnalysisOptions(params=350_000_000, gpu_memory=int(6.75 * 1024**3)),
    )
    assert report.facts.memory_model is not None and report.facts.snapshots
    redacted = redact_report(report)
    assert redacted.facts.memory_model is not None
    assert redacted.facts.memory_model.budget == report.facts.memory_model.budget  # no names
    for render in (render_text, render_json, render_markdown, render_html):
        assert render(redacted)
