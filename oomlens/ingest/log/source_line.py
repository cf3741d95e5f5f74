"""The phase a line of source code says, when it is the code that raised: the source line a
paste shows right above an error that has no frame of its own (the paste starts at it), or the
innermost frame's current line when no frame places the error.

Python prints, under the innermost frame, the line that was running when the exception was
raised; a paste that keeps only that line and the error keeps what an engineer reads first.  The
line is read as code (it must parse as a Python statement or the start of one, so prose above
an error is not read), and says a phase two ways:

- the calls it makes, read as frames by the traceback reader's own table and the library
  knowledge (``loss.backward()`` is backward, ``model.generate(`` generation,
  ``model.save_pretrained(output_dir)`` a checkpoint save);
- the optimizer state it touches: the moment buffers ``torch.optim`` keeps per parameter in
  ``optimizer.state[p]`` under these names (``adam.py`` / ``adamw.py``: ``exp_avg``,
  ``exp_avg_sq``, ``max_exp_avg_sq``; ``sgd.py``: ``momentum_buffer``; ``rmsprop.py`` and
  ``adadelta.py``: ``square_avg``, ``acc_delta``; ``adamax.py``: ``exp_inf``), and that its
  update functions name their locals after (``device_exp_avg_sqs``): only an optimizer step
  computes on them (the same mark the knowledge generator reads in a function's body).
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache

from oomlens.facts.log import Frame, Phase
from oomlens.ingest.log.traceback import classify_phase

MAX_SOURCE_CHARS = 300
"""Python's source line as the readers keep it; a longer line is not read."""

OPTIMIZER_STATE_NAMES = frozenset(
    {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "acc_delta"}
    | {"exp_inf"}
)
"""``torch.optim``'s per-parameter state keys that name moment buffers (see the module
docstring); the shorter keys (``sum``, ``mu``, ``eta``, ``ax``) are ordinary words in code."""

_STATE_PART = re.compile(
    r"(?:^|_)(" + "|".join(sorted(OPTIMIZER_STATE_NAMES, key=len, reverse=True)) + r")s?(?:_|$)"
)
"""A state key as a whole part of a local's name: the update functions name their lists and
temporaries after it (``device_exp_avg_sqs``, ``exp_avg_sq_sqrt`` in ``_multi_tensor_adam``)."""


def _state_name(name: str) -> str | None:
    match = _STATE_PART.search(name) if len(name) <= 100 else None
    return match.group(1) if match is not None else None


_CLOSERS = ("", ")", "))", ")))")
"""A traceback shows the first line of a statement that spans several (``x = f(``)."""


def _parsed(code: str) -> ast.AST | None:
    for closer in _CLOSERS:
        try:
            return ast.parse(code + closer)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    return None


def _named(tree: ast.AST) -> set[str]:
    """The variable, attribute and string-key names the code touches."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


def _calls(tree: ast.AST) -> list[str]:
    """The functions the code calls, outermost call first."""
    calls: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                calls.append(func.attr)
            elif isinstance(func, ast.Name):
                calls.append(func.id)
    return calls


@lru_cache(maxsize=256)
def source_line_phase(line: str, filename: str = "") -> tuple[Phase, str] | None:
    """The phase ``line`` (Python source, as a traceback prints it) says, and why; None when
    it is not code or says nothing.  ``filename``: the file the line is in, when a frame says.
    Cached: a log that repeats one traceback reads its line once."""
    code = line.strip()
    if not code or len(code) > MAX_SOURCE_CHARS:
        return None
    tree = _parsed(code)
    if tree is None:
        return None
    state = sorted(
        found for found in (_state_name(name) for name in _named(tree)) if found is not None
    )
    if state:
        return Phase.OPTIMIZER_STEP, f"{code[:160]} computes on the optimizer's {state[0]}"
    calls = _calls(tree)
    if not calls:
        return None
    phase, said = classify_phase([Frame(filename, 0, name) for name in calls])
    if phase is Phase.UNKNOWN or said is None:
        return None
    return phase, f"{code[:160]} calls {said.rsplit(' in ', 1)[-1]}"
