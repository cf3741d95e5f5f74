"""Assemble Python tracebacks from a stream of lines, and tell the training phase from frames.

One ``TracebackAssembler`` per producing stream (rank): feed it that stream's lines (prefixes
already stripped) and it returns a ``FinishedException`` when an exception message ends:
``Traceback (most recent call last):``, the ``File "...", line N, in f`` frames, the
exception line and its continuation lines (multi-line messages such as cudaMallocAsync's or
the driver's), ended by a blank line, a chain marker (``During handling of the above
exception...``), a new traceback, a log record, a bounded number of lines, or ``close()``.

Memory is bounded: a traceback keeps its first and last frames, an exception message a
bounded number of lines and characters.

``classify_phase(frames)`` maps frames to a ``Phase``; see its docstring for the rules.
``classify_traceback(traceback)`` also reads the call on the innermost frame's current line when
the traceback was cut before the callee's frames.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime

from oomlens.facts import SourceRef
from oomlens.facts.log import Frame, Phase, Traceback
from oomlens.ingest.log.oom_text import squeezed_text
from oomlens.ingest.log.tb_shapes import (
    LineShape,
    Shape,
    box_body,
    box_content_shape,
    is_source_line,
    line_shape,
)
from oomlens.ingest.log.torch_oom import ANCHOR_CONTEXT, has_allocator_start, looks_like_oom
from oomlens.knowledge.frames import frame_role, phase_of_role
from oomlens.lazyregex import lazy_regex

HEADER = "Traceback (most recent call last):"
CHAIN_MARKERS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
MAX_HEAD_FRAMES = 8
MAX_TAIL_FRAMES = 56
MAX_EXCEPTION_LINES = 12
MAX_OOM_MESSAGE_LINES = 160
_COMPLETE_ENDINGS = ("PyTorch", "cached", "1EB")
"""What the last clause of a complete caching-allocator message holds, spaces removed
(``torch_oom.parse_oom_message``'s ``complete``: reserved in total by PyTorch, cached, is
reserved by PyTorch but unallocated, more than 1EB)."""
"""An OOM message wrapped at a narrow column spans this many lines at most (800 characters
at five columns)."""
MAX_EXCEPTION_CHARS = 8000
STALE_AFTER_LINES = 400
"""An open traceback whose stream printed nothing for this many lines of the file is closed:
its process stopped writing (killed) and other streams go on."""

_EXCEPTION_LINE = lazy_regex(
    r"(?P<cls>[A-Za-z_][\w]{0,100}(?:\.[A-Za-z_][\w]{0,100}){0,12})(?::(?: (?P<msg>.*))?)?\Z"
)
_EXCEPTION_NAME = lazy_regex(
    r"(?:Error|Exception|Interrupt|Exit|Warning|Iteration|Failure|Fault|Timeout|Abort(?:ed)?|"
    r"Killed|Cancell?ed|Exhausted)\s*\Z"
)
"""How the classes of exceptions end (Python's own and the libraries'), for an exception line
printed without a message."""
_LOG_RECORD = lazy_regex(
    r"\[\d{4}-\d\d-\d\d[ T]|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d|"
    r"\[?[IWEF]\d{4} \d\d:\d\d:\d\d|\[[IWEF]\d{4} "
)
"""A logger's record, which starts no exception line and continues no message: DeepSpeed's
``[2026-11-30 06:40:33,625]``, Python logging's default ``2026-12-01 10:24:13,851`` (its
``asctime``), glog's ``W1130 06:30:28.828000``."""


@dataclass(frozen=True, slots=True)
class FinishedException:
    """An exception message that ended, with its traceback when one preceded it."""

    source: SourceRef
    """Where the exception line was read."""
    exception_class: str
    text: str
    traceback: Traceback | None
    time: datetime | None = None
    """What the caller passed as ``now`` with the exception line."""


class TracebackAssembler:
    """Per-stream state machine; see the module docstring."""

    __slots__ = (
        "_box_closed",
        "_chained",
        "_clear_lines",
        "_clear_of",
        "_clear_start",
        "_ending_lines",
        "_ending_of",
        "_ending_seen",
        "_current",
        "_exc_class",
        "_exc_limit",
        "_exc_lines",
        "_exc_ref",
        "_exc_time",
        "_frames_head",
        "_frames_omitted",
        "_frames_tail",
        "_header_ref",
        "_header_class",
        "_headless",
        "_last_line",
        "_margin",
        "_path_line",
        "_path_start",
        "_state",
        "_style",
    )

    def __init__(self) -> None:
        self._state = 0  # 0 idle, 1 in frames, 2 in exception message
        self._header_ref: SourceRef | None = None
        self._frames_head: list[Frame] = []
        self._frames_tail: deque[Frame] = deque(maxlen=MAX_TAIL_FRAMES)
        self._frames_omitted = 0
        self._exc_class = ""
        self._exc_lines: list[str] = []
        self._exc_ref: SourceRef | None = None
        self._exc_time: datetime | None = None
        self._exc_limit = MAX_EXCEPTION_LINES
        self._chained = False
        self._last_line = 0
        self._margin = ""  # what stands before the header: an indented paste's indentation
        self._style = "python"
        self._headless = False
        self._header_class = ""
        self._box_closed = False
        self._path_start = ""
        self._path_line: int | None = None  # where the wrapped frame in _path_start began
        self._current: str | None = None
        self._clear_of: list[str] | None = None  # the message whose first lines were searched
        self._clear_lines = 0  # ... and how many of them hold no allocator message start
        self._clear_start = False  # ... or that they hold one
        self._ending_of: list[str] | None = None  # the message searched for a last clause
        self._ending_lines = 0
        self._ending_seen = False

    @property
    def open(self) -> bool:
        """True while a traceback or an exception message is being collected."""
        return self._state != 0

    @property
    def in_frames(self) -> bool:
        """True between ``Traceback (most recent call last):`` and the exception line."""
        return self._state == 1

    @property
    def exception_class(self) -> str | None:
        """The class of the exception message being collected, if one is."""
        return self._exc_class if self._state == 2 else None

    @property
    def oom_like(self) -> bool:
        """The exception message being collected looks like an OOM message."""
        return self._state == 2 and self._exc_limit == MAX_OOM_MESSAGE_LINES

    @property
    def message_lines(self) -> int:
        """Lines of the exception message collected so far."""
        return len(self._exc_lines) if self._state == 2 else 0

    @property
    def exception_text(self) -> str:
        """The exception message collected so far ('' when none is being collected)."""
        return _join(self._exc_lines) if self._state == 2 else ""

    def may_hold_allocator_message(self) -> bool:
        """False when the exception message collected so far holds no start of a
        caching-allocator message (so cannot hold a complete one).  Incremental: only the lines
        added since the last call are searched, with enough of the earlier ones for a start cut
        by a wrap; a reader asks on every line of a message up to ``MAX_OOM_MESSAGE_LINES``.
        Once a start is there it stays there (the message only grows): searching it again on
        every line was quadratic in a message's length (fuzz campaign I: 20,000 long lines of
        unfinished messages, 8 of 15 CPU seconds)."""
        lines = self._exc_lines
        if self._state != 2:
            return False
        if self._clear_of is not lines:
            self._clear_of, self._clear_lines, self._clear_start = lines, 0, False
        if self._clear_start:
            return True
        begin = self._clear_lines
        if begin >= len(lines):
            return False
        before, at = "", begin
        while at > 0 and len(before) < ANCHOR_CONTEXT:
            at -= 1
            before = squeezed_text(lines[at]) + before
        if has_allocator_start(before + squeezed_text("".join(lines[begin:]))):
            self._clear_start = True
            return True
        self._clear_lines = len(lines)
        return False

    def may_be_complete(self) -> bool:
        """False while the exception message collected so far holds none of the words a
        complete caching-allocator message ends its last clause with (``... by PyTorch``,
        ``... cached)``, ``more than 1EB``), so that parsing it cannot find it complete.
        Incremental like ``may_hold_allocator_message``: once one is there it stays there."""
        lines = self._exc_lines
        if self._state != 2:
            return False
        if self._ending_of is not lines:
            self._ending_of, self._ending_lines, self._ending_seen = lines, 0, False
        if self._ending_seen:
            return True
        begin = self._ending_lines
        if begin >= len(lines):
            return False
        before, at = "", begin
        while at > 0 and len(before) < ANCHOR_CONTEXT:
            at -= 1
            before = squeezed_text(lines[at]) + before
        window = before + squeezed_text("".join(lines[begin:]))
        self._ending_lines = len(lines)
        self._ending_seen = any(word in window for word in _COMPLETE_ENDINGS)
        return self._ending_seen

    def stale(self, line_number: int) -> bool:
        return self._state != 0 and line_number - self._last_line > STALE_AFTER_LINES

    def start_exception(
        self, exception_class: str, text: str, ref: SourceRef, now: datetime | None = None
    ) -> FinishedException | None:
        """Start collecting an exception message seen outside a traceback (e.g. the
        ``what():`` of an uncaught C++ exception); returns what this closed."""
        finished = self.close() if self._state == 2 else None
        self._state = 2
        self._exc_class = exception_class
        self._exc_lines = [text[:MAX_EXCEPTION_CHARS]]
        self._exc_ref = ref
        self._exc_time = now
        self._exc_limit = _exception_line_limit(text)
        self._last_line = ref.line or 0
        return finished

    def feed(
        self, text: str, ref: SourceRef, now: datetime | None = None
    ) -> FinishedException | None:
        """Feed one line of this stream; returns an exception that this line ended, if any.

        ``now`` (the caller's current time estimate) is kept with an exception line and
        handed back as ``FinishedException.time``."""
        line = ref.line or 0
        raw = text
        if self._margin and self._state and text.startswith(self._margin):
            text = text[len(self._margin) :]
        shape = line_shape(text)
        if shape.shape is Shape.HEADER:
            finished = self.close() if self._state else None
            self._begin(ref, shape.style)
            self._header_class = shape.header_class or ""
            body = raw.lstrip(" \t")
            if shape.style == "python" and body.startswith(HEADER):
                # Python writes its header at the start of the line: whitespace before it was
                # put there by whoever indented the text (a Markdown code block, a tab-indented
                # mail or paste), and stands before each of the traceback's lines, where it
                # would read as a frame's deeper indentation (the exception line as source).
                # (Not a progress bar's text before a header glued to it.)
                self._margin = raw[: len(raw) - len(body)]
            return finished
        stripped = text.strip()
        if stripped in CHAIN_MARKERS:
            if self._state == 0:
                self._chained = True  # the next traceback was caused by the last one
                return None
            finished = self.close()
            self._chained = True
            self._last_line = line
            return finished
        if self._state == 0:
            if not _starts_inside(shape, text):
                return None
            # A paste that starts inside a traceback: its first frame (or rich's current-line
            # marker) stands for the header it lost.
            self._begin(ref, shape.style, headless=True)
        if self._state == 1:
            return self._in_frames(text, stripped, shape, ref, now)
        # state 2: continuation lines of the exception message
        if len(self._exc_lines) == MAX_EXCEPTION_LINES and looks_like_oom(self.exception_text):
            self._exc_limit = MAX_OOM_MESSAGE_LINES  # its first line was cut before saying so
        if (
            not stripped
            or _LOG_RECORD.match(text)
            or len(self._exc_lines) >= self._exc_limit
            or (shape.shape is Shape.FRAME and shape.style == "python")
        ):
            return self.close()
        self._exc_lines.append(text[:MAX_EXCEPTION_CHARS])
        self._last_line = line
        return None

    def _in_frames(
        self,
        text: str,
        stripped: str,
        shape: LineShape,
        ref: SourceRef,
        now: datetime | None,
    ) -> FinishedException | None:
        self._last_line = ref.line or 0
        if self._path_start and shape.style == "rich" and text[:1] in ("│", "┃"):
            joined = box_content_shape(self._path_start + box_body(text))
            self._path_start = ""
            if joined.frame is not None:
                self._add_frame(joined.frame, self._path_line)
                return None
        if shape.shape is Shape.FRAME and shape.frame is not None:
            self._path_start = ""
            self._add_frame(shape.frame, ref.line)
            return None
        if shape.shape is Shape.PATH_START:
            self._path_start = shape.text[:1000]
            self._path_line = ref.line
            return None
        if shape.shape is Shape.BOX_END:
            self._box_closed = True
            return None
        if shape.shape is Shape.INSIDE or is_source_line(text, self._style):
            self._current = _current_line(text, self._style, self._current)
            return None  # source line, carets, a box's inside, or a blank inside the traceback
        match = _EXCEPTION_LINE.match(text)
        if match is not None and ":" not in text and not _EXCEPTION_NAME.search(text):
            # A bare word that no exception class ends with (``Runt``, ``OutOfMe``): the paste
            # cut the exception line, and what was cut says nothing of what it was.
            match = None
        if match is not None and self._style == "ipython" and self._header_class:
            # IPython names the class in its header and ends the traceback with the same name
            # (``OutOfMemoryError: ...``): a line naming another is not its end, but a line of
            # another process's output written between its lines
            if match.group("cls").rsplit(".", 1)[-1] != self._header_class.rsplit(".", 1)[-1]:
                match = None
        if match is None or _LOG_RECORD.match(text):
            if self._style == "ipython" and match is None:
                return None  # a frame line wrapped by the paste: only the exception ends it
            # Not an exception line: the traceback was cut here.
            return self.close()
        self._state = 2
        self._exc_class = match.group("cls")
        self._exc_lines = [text[:MAX_EXCEPTION_CHARS]]
        self._exc_ref = ref
        self._exc_time = now
        self._exc_limit = _exception_line_limit(text)
        return None

    def close(self) -> FinishedException | None:
        """End what is open (end of input, stale stream, new traceback)."""
        state, self._state = self._state, 0
        if state == 0:
            return None
        traceback = None
        if self._header_ref is not None:
            traceback = Traceback(
                source=self._header_ref,
                frames=tuple(self._frames_head) + tuple(self._frames_tail),
                frames_omitted=self._frames_omitted,
                exception_class=self._exc_class if state == 2 else None,
                exception_text=_join(self._exc_lines) if state == 2 else None,
                cut=state == 1,
                chained=self._chained,
                headless=self._headless,
                style=self._style,
                current_line=self._current or None,
            )
        self._header_ref = None
        self._chained = False
        self._headless = False
        self._path_start = ""
        header_class, self._header_class = self._header_class, ""
        if state == 1:
            assert traceback is not None
            # IPython's header names the class: a traceback cut before its message still says
            # what was raised
            return FinishedException(traceback.source, header_class, "", traceback)
        assert self._exc_ref is not None
        return FinishedException(
            self._exc_ref, self._exc_class, _join(self._exc_lines), traceback, self._exc_time
        )

    def _begin(self, ref: SourceRef, style: str = "python", *, headless: bool = False) -> None:
        self._state = 1
        self._header_ref = ref
        self._frames_head = []
        self._frames_tail = deque(maxlen=MAX_TAIL_FRAMES)
        self._frames_omitted = 0
        self._exc_lines = []
        self._last_line = ref.line or 0
        self._style = style
        self._headless = headless
        self._box_closed = False
        self._path_start = ""
        self._current = None
        self._margin = ""

    def _add_frame(self, frame: Frame, at: int | None) -> None:
        self._current = None
        frame = replace(frame, at=at)
        if len(self._frames_head) < MAX_HEAD_FRAMES:
            self._frames_head.append(frame)
            return
        if len(self._frames_tail) == MAX_TAIL_FRAMES:
            self._frames_omitted += 1
        self._frames_tail.append(frame)


_RICH_CURRENT = lazy_regex(r"❱\s{0,8}\d{1,7}\s{0,4}[│┃|]\s{0,200}(?P<code>\S.{0,300})")
_IPY_CURRENT = lazy_regex(r"-{1,12}>\s{0,12}\d{1,7}\s{1,40}(?P<code>\S.{0,300})")
_CARET_CHARS = frozenset("^~ \t")


def _current_line(text: str, style: str, current: str | None) -> str | None:
    """The innermost frame's current source line so far, given one more line inside the
    traceback: rich's ``❱ N │ code``, IPython's ``----> N code``, or the first source line
    under a Python frame (not its carets)."""
    if style == "rich":
        match = _RICH_CURRENT.search(box_body(text)) if "❱" in text else None
        return match.group("code").rstrip() if match is not None else current
    if style == "ipython":
        match = _IPY_CURRENT.match(text.strip())
        return match.group("code").rstrip() if match is not None else current
    code = text.strip()
    if current is None and code and not set(code[:400]) <= _CARET_CHARS:
        return code[:300]
    return current


def _starts_inside(shape: LineShape, text: str) -> bool:
    """A line that shows, on its own, that the text is inside a traceback: a frame, or the
    current-line marker of rich's or IPython's source lines."""
    if shape.shape is Shape.FRAME:
        return True
    if shape.style == "rich":
        return "❱" in text
    return shape.style == "ipython" and shape.shape is Shape.INSIDE


def _exception_line_limit(first_line: str) -> int:
    """How many lines an exception message may take: an OOM message wrapped by a terminal or
    a paste takes many."""
    return MAX_OOM_MESSAGE_LINES if looks_like_oom(first_line) else MAX_EXCEPTION_LINES


def _join(lines: list[str]) -> str:
    return "\n".join(lines)[:MAX_EXCEPTION_CHARS]


def exception_message(exception_class: str, text: str) -> str:
    """The message of an exception line ``cls: message`` (the text after the class)."""
    head = exception_class + ":"
    if text.startswith(head):
        return text[len(head) :].lstrip()
    return text


# --- phases -------------------------------------------------------------------------------

_CHECKPOINT_FUNCS = frozenset(
    {
        "save_checkpoint",
        "_save_checkpoint",
        "save_model",
        "save_pretrained",
        "_get_zero_param_shapes",
        "get_fp32_state_dict_from_zero_checkpoint",
        "save_state",
        "save_16bit_state_dict",
        "get_state_dict",
        "_full_post_state_dict_hook",
        "save_lora_weights",
    }
)
_GENERATION_FUNCS = frozenset(
    {
        "generate",
        "_sample",
        "assisted_decoding",
        "sample",
        "beam_sample",
        "_beam_sample",
        "generate_until",
    }
)
_EVAL_FUNCS = frozenset(
    {
        "evaluate",
        "predict",
        "eval_step",
        "validation_step",
        "validate",
        "_evaluate",
        "run_eval",
        "evaluate_model",
        "eval_loop",
        "test_step",
        "run_validation",
        "validation_loop",
        "do_eval",
        "eval_epoch",
        "val_step",
    }
)
_EVAL_NAME = lazy_regex(r"(?:eval|evaluat\w*|valid\w*)(?:_\w{0,40})?\Z|\w{0,40}_eval\Z")
_INIT_FUNCS = frozenset(
    {
        "from_pretrained",
        "initialize",
        "_create_fp32_partitions",
        "_setup_for_real_optimizer",
        "reset_parameters",
        "_init_weights",
        "init_weights",
        "load_checkpoint",
        "_create_fp16_partitions",
        "_create_fp16_partitions_with_defragmentation",
        "defragment",
        "_init_model",
    }
)
_STEP_FUNCS = frozenset(
    {
        "step",
        "optimizer_step",
        "_prepare_fp32_grad_for_sub_group",
        "clip_grad_norm_",
        "_apply_optimizer",
    }
)
_BACKWARD_FUNCS = frozenset(
    {
        "backward",
        "run_backward",
        "_backward",
        "_backward_hook",
        "grad",
    }
)
_FORWARD_FUNCS = frozenset(
    {
        "forward",
        "compute_loss",
        "_forward",
        "forward_step",
        "__call__",
    }
)
_STEP_LIBRARIES = (
    "torch/optim/",
    "deepspeed/",
    "accelerate/",
    "transformers/",
    "lightning/",
    "apex/",
    "bitsandbytes/",
    "torch/amp/",
    "torch/cuda/amp/",
)
_CONTEXT = (
    Phase.CHECKPOINT_SAVE,
    Phase.GENERATION,
    Phase.EVALUATION,
    Phase.DATA_LOADING,
    Phase.MODEL_INIT,
)


_TRAINING = (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER_STEP)
_VLLM_CACHE = frozenset({"_init_cache", "initialize_from_config"})
_EVAL_PATHS = ("loops/evaluation_loop.py", "loops/prediction_loop.py")


def _frame_phase(frame: Frame) -> Phase | None:
    """The phase of one frame: the library knowledge's (``oomlens.knowledge``), generated
    from the libraries' source, for a library function it holds (None for a role of several
    phases: a ZeRO gather, a collective, a config check); otherwise read from the frame's
    module and name (user code, a library version or file the data does not hold)."""
    known = frame_role(frame.filename, frame.function)
    if known is not None:
        return phase_of_role(known.role)
    return _named_phase(frame)


def _named_phase(frame: Frame) -> Phase | None:
    # IPython and Colab print qualified names ("_BaseAutoModelClass.from_pretrained")
    func = frame.function.rsplit(".", 1)[-1]
    path = frame.filename.replace("\\", "/")
    if "torch/utils/data/" in path:
        return Phase.DATA_LOADING
    if "/vllm/" in path:
        # an inference engine's KV cache, sized and allocated before it generates
        if func in _VLLM_CACHE:
            return Phase.GENERATION
    if any(part in path for part in _EVAL_PATHS):
        return Phase.EVALUATION
    if func in _CHECKPOINT_FUNCS or (func in ("save", "_save") and "torch/serialization" in path):
        return Phase.CHECKPOINT_SAVE
    if func in _GENERATION_FUNCS and (func == "generate" or "generat" in path):
        return Phase.GENERATION
    if func in _EVAL_FUNCS or _EVAL_NAME.match(func):
        return Phase.EVALUATION
    if (
        func in _INIT_FUNCS
        or (
            func == "__init__"
            and (
                "torch/nn/modules/" in path
                or "deepspeed/runtime/" in path
                or "deepspeed/__init__" in path
            )
        )
        or (func in ("to", "cuda", "_apply", "convert") and "torch/nn/modules/module.py" in path)
    ):
        if func == "initialize" and "deepspeed" not in path:
            return None
        return Phase.MODEL_INIT
    if (
        func in _BACKWARD_FUNCS
        or func.endswith("_backward")
        or "backward_" in func
        or ("reduce_and_partition_ipg_grads" in func)
    ):
        if func == "grad" and "torch/autograd" not in path:
            return None
        return Phase.BACKWARD
    if (
        "torch/optim/" in path
        or "deepspeed/ops/adam" in path
        or (func in _STEP_FUNCS and (func != "step" or any(lib in path for lib in _STEP_LIBRARIES)))
    ):
        # A bare ``step`` is only an optimizer step inside a training library: user code
        # names many things ``step`` (a sampling step, a scheduler step...).
        return Phase.OPTIMIZER_STEP
    if func in _FORWARD_FUNCS:
        if func == "__call__" and "torch/nn/modules/module.py" not in path:
            return None
        return Phase.FORWARD
    return None


def _evidence(frame: Frame) -> str:
    return f"{frame.filename}:{frame.line} in {frame.function}"


def classify_phase(frames: tuple[Frame, ...] | list[Frame]) -> tuple[Phase, str | None]:
    """``deciding_frame``'s phase, and its frame as ``file:line in function``."""
    phase, frame = deciding_frame(frames)
    return phase, _evidence(frame) if frame is not None else None


def deciding_frame(frames: tuple[Frame, ...] | list[Frame]) -> tuple[Phase, Frame | None]:
    """The training phase a traceback's frames (outermost first) show, and the deciding frame.

    Context phases (checkpoint save, generation, evaluation, data loading, model init) win
    over training phases, innermost context first: ``evaluate -> forward`` is evaluation,
    ``save_checkpoint`` is a save wherever it is called from; a library's ``__init__`` called
    from a training frame is no model init.  Otherwise the innermost
    training frame decides (forward, backward, optimizer step), except that a forward run
    inside a backward (activation-checkpoint recomputation) is backward.  A frame of
    ``torch.no_grad``'s decorator around a forward with no other evidence reads as
    evaluation (not one inside it: DeepSpeed's hooks are no_grad-decorated).  A function named
    ``step`` is an optimizer step only inside a training library.  When no frame says anything,
    an error raised in a constructor (the innermost frame is ``__init__``) is the object being
    built: model init; otherwise ``(Phase.UNKNOWN, None)``.
    """
    training: tuple[Phase, Frame] | None = None
    backward_outside: Frame | None = None
    for index in range(len(frames) - 1, -1, -1):
        frame = frames[index]
        phase = _frame_phase(frame)
        if phase is Phase.MODEL_INIT and frame.function == "__init__":
            # A library object built inside a training step (ZeRO-3's gather handles are)
            # is not the model being built.
            if any(_frame_phase(f) in _TRAINING for f in frames[:index]):
                continue
        if phase in _CONTEXT:
            return phase, frame
        if phase is None:
            continue
        if training is None:
            training = (phase, frame)
        elif phase is Phase.BACKWARD and backward_outside is None:
            backward_outside = frame
    # A no_grad decorator *around* the whole model call says evaluation; DeepSpeed's own hooks
    # run under no_grad inside every training forward, so one inside does not.
    no_grad = False
    for frame in frames:
        if frame.function == "decorate_context" and "torch/utils/_contextlib" in frame.filename:
            no_grad = True
            break
        if _frame_phase(frame) is not None:
            break
    if training is None:
        innermost = frames[-1] if frames else None
        if innermost is not None and innermost.function.rsplit(".", 1)[-1] == "__init__":
            # Nothing else speaks and the error left an object's constructor: building it
            # (a model, an engine loading its weights) is what allocated.
            return Phase.MODEL_INIT, innermost
        return Phase.UNKNOWN, None
    phase, frame = training
    if phase is Phase.FORWARD and backward_outside is not None:
        return Phase.BACKWARD, backward_outside
    if phase is Phase.FORWARD and no_grad:
        return Phase.EVALUATION, frame
    return phase, frame


_CALL = lazy_regex(r"(?P<name>[A-Za-z_]\w{0,100})\s{0,4}\(")


def classify_traceback(traceback: Traceback) -> tuple[Phase, str | None, SourceRef | None]:
    """``classify_phase`` of the traceback's frames, and where the deciding frame was read
    (None when its line is unknown); when the traceback was cut before its
    exception, the calls on its innermost frame's current source line stand for the frames the
    text lost (``model.save_pretrained(output_dir)`` highlighted in a cut rich traceback is a
    checkpoint save), and the evidence quotes that line (cited at that frame)."""
    phase, frame = deciding_frame(traceback.frames)
    evidence = _evidence(frame) if frame is not None else None
    current = traceback.current_line
    if not traceback.cut or not current or not traceback.frames:
        return phase, evidence, _frame_source(traceback, frame)
    last = traceback.frames[-1]
    calls = tuple(Frame(last.filename, last.line, m.group("name")) for m in _CALL.finditer(current))
    called, said = classify_phase(traceback.frames + calls)
    if said is None or said == evidence or not any(said == _evidence(c) for c in calls):
        return phase, evidence, _frame_source(traceback, frame)
    return (
        called,
        f"{last.filename}:{last.line} in {last.function} calls {current[:160]} (the traceback "
        "stops there)",
        _frame_source(traceback, last),
    )


def _frame_source(traceback: Traceback, frame: Frame | None) -> SourceRef | None:
    """Where ``frame`` of ``traceback`` was read: the traceback's file, rank and host, the
    frame's own line."""
    if frame is None or frame.at is None:
        return None
    return replace(traceback.source, line=frame.at)
