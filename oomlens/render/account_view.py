"""The memory account (``oomlens.facts.account``) as every human report shows it: one row per
term (what held the card, its bytes, the range the inputs bound it to, how it is known and
from where), what the failing pass needed against the limit, and the model states once all of
them exist when that differs from the states at the failure.

Shared by the terminal summary (``oomlens.render.text``) and the view the HTML and Markdown
templates format (``oomlens.render.view``), so that every format shows the same rows.  Every
string is cleaned of control and bidi characters and capped (``bounded.text``); nothing here is
markup.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlens.facts.account import AccountTerm, MemoryAccount, Term
from oomlens.render import words
from oomlens.render.bounded import MAX_SHORT_TEXT, size, text

MAX_SOURCE_TEXT = 600


@dataclass(frozen=True, slots=True)
class AccountRow:
    term: str
    """The term's id (``model_states``), for anchors and tests."""
    label: str
    """The term in words (``model states``)."""
    bytes: str
    bytes_value: int
    range: str
    """``low to high`` when the inputs only bound the term, else empty."""
    basis: str
    source: str
    note: str


@dataclass(frozen=True, slots=True)
class AccountView:
    heading: str
    """Whose account: ``rank 1, device 1, forward``."""
    limit: str
    """The limit formatted (``16.00 GiB``), empty when the message gives none."""
    limit_name: str
    """What the limit is: ``allowed (a per-process cap)`` or ``total capacity``."""
    limit_source: str
    needed: str
    """The live tensors plus the failed request, formatted (empty when unknown)."""
    rows: tuple[AccountRow, ...]
    at_peak: AccountRow | None
    """The model states once gradients and optimizer states all exist (labelled ``model
    states at peak``), when not the same as the states at the failure (a failure before the
    first optimizer step holds fewer)."""


def _row(item: AccountTerm, label: str = "") -> AccountRow:
    bounded = item.low is not None and item.high is not None and item.low != item.high
    return AccountRow(
        term=item.term.value,
        label=label or words.term(item.term),
        bytes=size(item.bytes),
        bytes_value=item.bytes,
        range=f"{size(item.low)} to {size(item.high)}" if bounded else "",
        basis=words.term_basis(item.basis),
        source=text(item.source, MAX_SOURCE_TEXT),
        note=text(item.note, MAX_SHORT_TEXT),
    )


def _heading(account: MemoryAccount) -> str:
    parts = []
    if account.rank is not None:
        parts.append(f"rank {account.rank}")
    if account.device is not None:
        parts.append(f"device {account.device}")
    phase = text(account.phase, 80).replace("_", " ")
    if phase and phase != "unknown":
        parts.append(phase)
    return ", ".join(parts)


def account_view(account: MemoryAccount | None) -> AccountView | None:
    """The rows of ``account`` (None when there is none: no GPU OOM, or a message without
    this process' figures)."""
    if account is None:
        return None
    states = account.term(Term.MODEL_STATES)
    at_peak = account.states_at_peak
    return AccountView(
        heading=_heading(account),
        limit=size(account.limit),
        limit_name="allowed (a per-process cap)" if account.limit_is_cap else "total capacity",
        limit_source=text(account.limit_source, MAX_SOURCE_TEXT),
        needed=size(account.needed),
        rows=tuple(_row(t) for t in account.terms),
        at_peak=_row(at_peak, f"{words.term(at_peak.term)} at peak")
        if at_peak is not None and at_peak != states
        else None,
    )
