"""Every character of Unicode's Bidi_Control property is stripped from what the inputs put in
the terminal, Markdown and HTML reports: the marks (U+061C, U+200E, U+200F) reorder the text
around them as the overrides and isolates do."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.cli import main

# Unicode 15.1 PropList.txt, Bidi_Control
BIDI_CONTROL = ["\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F))]
BIDI_CONTROL += [*map(chr, range(0x2066, 0x206A))]


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_no_bidi_control_reaches_a_report(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marks = "".join(BIDI_CONTROL)
    log = tmp_path / f"train{marks}.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        f'  File "/home/u/tr{marks}ain.py", line 7, in <module>\n'
        "    main()\n"
        f"RuntimeError: CUDA error: an illegal {marks}memory access was encountered\n",
        encoding="utf-8",
    )
    html = tmp_path / "report.html"
    args = ["analyze", str(log), "--width", "0"]
    args += ["--html", str(html)] if fmt == "html" else ["--format", fmt]

    with pytest.raises(SystemExit):
        main(args)

    out = html.read_text(encoding="utf-8") if fmt == "html" else capsys.readouterr().out
    assert "illegal memory access" in out
    found = sorted({f"U+{ord(c):04X}" for c in out if c in BIDI_CONTROL})
    assert not found, found
