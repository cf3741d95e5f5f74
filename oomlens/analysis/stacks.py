"""Who allocated a block: the first user frame of its stack, and what kind of memory it probably is.

Frames are dicts ``{'name', 'filename', 'line'}``, innermost first.  Python frames have a
``.py`` filename (or ``<...>`` for generated code) and a line > 0; native frames
(``stacks='all'``) have line 0 and a filename that is ``'??'``, ``''`` or a C++ basename.

**First user frame.**  The innermost Python frame whose file is not library code.  Library
code is: anything under ``site-packages``/``dist-packages``; the standard library
(``.../lib/pythonX.Y/``); ``<frozen ...>`` and FX/Inductor-generated code; and any file inside a
directory named after a framework package (:data:`FRAMEWORK_PACKAGES`: torch, deepspeed,
transformers, accelerate, ...), which covers editable installs and source checkouts.  (A user
script that itself sits in a directory called ``torch`` is taken for library code.)  When a
stack has no user frame the site is the innermost library Python frame; when it has no Python
frame at all (backward-pass allocations made on the autograd thread) it is the autograd node
(``AddmmBackward0::apply``) or, failing that, the first native frame that is not allocator or
dispatcher plumbing.  Blocks without frames have no site (None).

**Category.**  The innermost frame that matches a rule decides (:class:`Attribution` keeps
the frame and how sure the rule is).  The rules, from frame names torch and DeepSpeed really
use (``deepspeed-reference.md`` §1.12, torch 2.11 snapshots):

* DeepSpeed ZeRO-3 all-gather (``_all_gather*``, ``fetch_sub_module``, ``__all_gather_params*``,
  ``_allgather_param*``...) -> ``zero3_gathered_params``;
* DeepSpeed gradient buckets and reduce-scatter (``__add_grad_to_ipg_bucket``,
  ``__reduce_and_partition_ipg_grads``, ``__avg_scatter_grads``, ``reduce_scatter_coalesced``,
  ``partition_grads``...) -> ``zero_buckets``;
* optimizer state init (``torch/optim`` ``_init_group``; DeepSpeed
  ``initialize_optimizer_states``, ``_create_fp32_partitions``, ``_optimizer_step``) ->
  ``optimizer_state``; other ``torch/optim`` frames -> ``temporaries`` (step intermediates);
* ``Module._apply`` / ``.to()`` / ``.cuda()``, state-dict loading, ``nn.Parameter``, module
  ``__init__``, DeepSpeed partitioning -> ``parameters``;
* autograd nodes (``*Backward*::apply``), ``AccumulateGrad``, the autograd engine, Python
  ``backward`` -> ``gradients`` (gradients and backward temporaries look the same);
* cuBLAS/cuBLASLt workspace frames -> ``workspace``;
* gradient clipping -> ``temporaries``;
* a ``forward`` frame -> ``activations`` (medium confidence: activations kept for backward
  and forward temporaries still referenced cannot be told apart);
* otherwise ``unknown`` (``no stack recorded`` or ``no frame recognised``).

:class:`StackResolver` caches by content (shared frame dicts are recognised by identity first),
so resolving the stacks of a million blocks costs about one dict lookup per frame list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from oomlens.facts.snapshot import CallSite, Confidence, MemoryCategory

FRAMEWORK_PACKAGES = frozenset(
    {
        "torch",
        "deepspeed",
        "transformers",
        "accelerate",
        "apex",
        "triton",
        "functorch",
        "torchvision",
        "torchaudio",
        "peft",
        "trl",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "transformer_engine",
        "flash_attn",
        "xformers",
        "bitsandbytes",
    }
)
"""Directory names whose files count as library code wherever they are installed."""

_STDLIB_RE = re.compile(r"/lib(?:64)?/python\d+(?:\.\d+)?t?/")

# DeepSpeed function names (frame 'name' is the unmangled co_name, e.g. '__add_grad_to_ipg_bucket').
_DS_GATHER = frozenset(
    {
        "_all_gather",
        "_all_gather_dtype",
        "_all_gather_sequential",
        "_all_gather_coalesced",
        "all_gather_coalesced",
        "_allgather_param",
        "_allgather_params",
        "_allgather_params_coalesced",
        "_allgather_params_sequential",
        "_dist_allgather_fn",
        "fetch_sub_module",
        "_fetch_sub_module_impl",
        "__all_gather_params",
        "__all_gather_params_",
        "_ensure_availability_of_partitioned_params",
        "_partitioned_buffers_all_gather",
    }
)
_DS_BUCKETS = frozenset(
    {
        "__add_grad_to_ipg_bucket",
        "__reduce_and_partition_ipg_grads",
        "__avg_scatter_grads",
        "__avg_scatter_contiguous_grads",
        "reduce_scatter_coalesced",
        "partition_grads",
        "reduce_independent_p_g_buckets_and_remove_grads",
        "reduce_ready_partitions_and_remove_grads",
        "allreduce_bucket",
        "allreduce_and_copy",
        "allreduce_no_retain",
        "average_tensor",
        "reduce_ipg_grads",
        "_setup_for_real_optimizer",
    }
)
_DS_OPTIMIZER_STATE = frozenset(
    {
        "initialize_optimizer_states",
        "_create_fp32_partitions",
        "_create_momentum_buffer",
        "_optimizer_step",
    }
)
_DS_PARAMETERS = frozenset(
    {
        "_convert_to_deepspeed_param",
        "_convert_to_zero_parameters",
        "_zero_init_param",
        "_partition_param",
        "_partition_param_sec",
        "_partition",
        "_create_fp16_partitions_with_defragmentation",
        "_move_to_flat_buffer",
        "defragment",
        "_configure_distributed_model",
    }
)
_DS_GRADIENTS = frozenset({"_prepare_fp32_grad_for_sub_group", "_prepare_sub_group"})
_MODULE_PARAMETER_FUNCS = frozenset(
    {
        "_apply",
        "<lambda>",
        "cuda",
        "to",
        "to_empty",
        "_load_from_state_dict",
        "load_state_dict",
        "half",
        "float",
        "bfloat16",
    }
)
_HF_LOADING_FUNCS = frozenset(
    {
        "from_pretrained",
        "_load_pretrained_model",
        "load_state_dict",
        "_load_state_dict_into_meta_model",
        "load_shard_file",
        "_load_state_dict_into_model",
    }
)
_AUTOGRAD_PY_FUNCS = frozenset({"backward", "_engine_run_backward", "grad", "run_backward"})

# Native frames that are plumbing between the op and the allocator, never a useful site.
_NATIVE_PLUMBING = (
    "unwind::unwind",
    "CapturedTraceback",
    "gather_with_cpp",
    "CUDACachingAllocator",
    "c10::impl::",
    "at::_ops::",
    "at::detail::empty",
    "at::native::empty",
    "at::empty",
    "at::TensorIteratorBase",
    "at::meta::",
    "set_output_raw_strided",
    "create_out",
    "torch::autograd::VariableType",
    "wrap_kernel_functor",
    "PyEval",
    "PyObject",
    "_PyEval",
    "_PyObject",
    "PyCMethod",
    "PyMethod",
    "PyType_",
    "PyRun",
    "Py_",
    "__libc",
    "_start",
    "__clone",
    "pthread_",
    "std::",
)

_MAX_TEXT = 2000
_BUCKET_LIMIT = 32
# Identity keys a stack found by content may get besides its first (one per set of equal frame
# dicts: a snapshot merged from several recordings has one set per recording); past that,
# equal stacks are found by content, at the same answer.  Bounds the resolver's memory when
# frame dicts are never shared.
_ALIASES_PER_STACK = 8
_KIND_USER = 0
_KIND_LIBRARY = 1
_KIND_NATIVE = 2
_KIND_INVALID = 3


@dataclass(frozen=True, slots=True)
class Attribution:
    """What a stack says: where it came from and what the memory probably is.

    ``site`` is the grouping frame (see the module docstring; None when there are no frames).
    ``evidence`` names the frame that decided the category and why.
    """

    site: CallSite | None
    category: MemoryCategory
    confidence: Confidence
    evidence: str


NO_STACK = Attribution(
    None, MemoryCategory.UNKNOWN, Confidence.HIGH, "no stack recorded for this allocation"
)
NO_PYTHON_STACK = Attribution(
    None,
    MemoryCategory.UNKNOWN,
    Confidence.MEDIUM,
    "no stack recorded: with stacks='python' that is an allocation made on the autograd "
    "(backward) thread, which has no Python stack, or one made before recording began",
)
"""What an empty stack means in a ``stacks='python'`` snapshot."""


@dataclass(frozen=True, slots=True)
class _FrameInfo:
    kind: int
    site: CallSite | None
    rule: tuple[MemoryCategory, Confidence, str] | None
    is_backward_node: bool


def is_library_file(filename: str) -> bool:
    """True when a Python frame's file is library code (see the module docstring)."""
    if filename.startswith("<"):
        return filename not in ("<string>", "<stdin>")
    path = filename.replace("\\", "/")
    if "/site-packages/" in path or "/dist-packages/" in path or "/torchinductor_" in path:
        return True
    if _STDLIB_RE.search(path):
        return True
    parts = path.split("/")
    return any(part in FRAMEWORK_PACKAGES for part in parts[:-1])


def _is_python_frame(filename: str, line: int) -> bool:
    return filename.endswith(".py") or line > 0 or filename.startswith("<")


def _python_rule(path: str, name: str) -> tuple[MemoryCategory, Confidence, str] | None:
    where = f"{path.rsplit('/', 1)[-1]} in {name}"
    if "/deepspeed/" in path or path.startswith("deepspeed/"):
        if name in _DS_GATHER:
            return (
                MemoryCategory.ZERO3_GATHERED_PARAMS,
                Confidence.HIGH,
                f"{where} (ZeRO-3 parameter all-gather)",
            )
        if name in _DS_BUCKETS:
            return (
                MemoryCategory.ZERO_BUCKETS,
                Confidence.HIGH,
                f"{where} (ZeRO gradient bucket / reduce-scatter)",
            )
        if name in _DS_OPTIMIZER_STATE:
            return (
                MemoryCategory.OPTIMIZER_STATE,
                Confidence.HIGH,
                f"{where} (DeepSpeed optimizer state)",
            )
        if name in _DS_PARAMETERS:
            return (
                MemoryCategory.PARAMETERS,
                Confidence.HIGH,
                f"{where} (DeepSpeed parameter partitioning)",
            )
        if name in _DS_GRADIENTS:
            return MemoryCategory.GRADIENTS, Confidence.HIGH, f"{where} (DeepSpeed fp32 gradients)"
        if "/deepspeed/ops/" in path and name == "step":
            return (
                MemoryCategory.OPTIMIZER_STATE,
                Confidence.MEDIUM,
                f"{where} (DeepSpeed optimizer step, lazy state init)",
            )
    if "/torch/optim/" in path:
        if name == "_init_group":
            return (
                MemoryCategory.OPTIMIZER_STATE,
                Confidence.HIGH,
                f"{where} (optimizer state init)",
            )
        return MemoryCategory.TEMPORARIES, Confidence.MEDIUM, f"{where} (optimizer step)"
    if path.endswith("/torch/nn/modules/module.py") and name in _MODULE_PARAMETER_FUNCS:
        return (
            MemoryCategory.PARAMETERS,
            Confidence.HIGH,
            f"{where} (module moved or loaded onto the GPU)",
        )
    if path.endswith("/torch/nn/parameter.py"):
        return MemoryCategory.PARAMETERS, Confidence.HIGH, f"{where} (nn.Parameter)"
    if "/torch/nn/modules/" in path and name in ("__init__", "reset_parameters"):
        return MemoryCategory.PARAMETERS, Confidence.MEDIUM, f"{where} (module construction)"
    if "/transformers/" in path and name in _HF_LOADING_FUNCS:
        return MemoryCategory.PARAMETERS, Confidence.MEDIUM, f"{where} (pretrained weights loading)"
    if path.endswith("/torch/nn/utils/clip_grad.py"):
        return MemoryCategory.TEMPORARIES, Confidence.MEDIUM, f"{where} (gradient clipping)"
    if (
        "/torch/autograd/" in path or path.endswith("/torch/_tensor.py")
    ) and name in _AUTOGRAD_PY_FUNCS:
        return MemoryCategory.GRADIENTS, Confidence.MEDIUM, f"{where} (backward pass)"
    if name == "forward":
        return MemoryCategory.ACTIVATIONS, Confidence.MEDIUM, f"{where} (inside a forward)"
    return None


def _native_rule(name: str) -> tuple[MemoryCategory, Confidence, str] | None:
    if "Workspace" in name or "workspace" in name:
        return MemoryCategory.WORKSPACE, Confidence.HIGH, f"{_short(name)} (library workspace)"
    if "AccumulateGrad" in name:
        return (
            MemoryCategory.GRADIENTS,
            Confidence.HIGH,
            f"{_short(name)} (gradient accumulated into .grad)",
        )
    if "Backward" in name and name.endswith("::apply"):
        return MemoryCategory.GRADIENTS, Confidence.MEDIUM, f"{_short(name)} (backward pass)"
    if "torch::autograd::Engine::" in name:
        return MemoryCategory.GRADIENTS, Confidence.MEDIUM, f"{_short(name)} (autograd engine)"
    return None


def _short(name: str) -> str:
    return CallSite("", 0, name, False, True).describe().removesuffix(" (native)")


class StackResolver:
    """Resolves frame lists to :class:`Attribution`, caching by content.

    An attribution depends only on what the frames say, so equal stacks are resolved once,
    however the pickle shared their objects.  torch's symbolizer shares one dict per distinct
    frame and gives most events their own list, so a million lists may hold a few thousand
    distinct stacks; a snapshot rebuilt by a tool that copies records gives every block and
    event its own frame dicts too.  A list is first looked up by its length and the
    identities of three of its frames (shared dicts), then, if that misses, by its length and
    the contents of those three frames; either way it is compared with the few stacks under
    that key (``==`` on lists compares the frame dicts at C speed, and stops at once on the
    very same dicts): about one microsecond per list whatever its depth, never a pass over
    its frames in Python.  A list found by content is also keyed by identity, so other lists
    of the same frame dicts are found the fast way, up to ``_ALIASES_PER_STACK`` keys per
    distinct stack.  The resolver keeps every list it stores, so the ``id()`` keys stay
    valid while it lives; create one per analysis.
    """

    def __init__(self, no_stack: Attribution = NO_STACK) -> None:
        self.no_stack = no_stack
        self._frames: dict[int, _FrameInfo] = {}
        self._frame_contents: dict[object, _FrameInfo] = {}
        self._buckets: dict[tuple[int, int, int, int], list[tuple[list[Any], Attribution]]] = {}
        self._by_content: dict[tuple[Any, ...], list[tuple[list[Any], Attribution]]] = {}
        self._aliases = 0
        self._exact: dict[tuple[int, ...], Attribution] = {}
        self._pinned: list[Any] = []

    def resolve(self, frames: object) -> Attribution:
        """Attribution of one frame list (innermost first); ``no_stack`` for ``[]`` / None."""
        if type(frames) is not list or not frames:
            return self.no_stack
        count = len(frames)
        middle = count >> 1
        key = (count, id(frames[0]), id(frames[middle]), id(frames[-1]))
        bucket = self._buckets.get(key)
        if bucket is not None:
            for known, attribution in bucket:
                try:
                    if known == frames:
                        return attribution
                except Exception:  # noqa: BLE001 - crafted items that cannot be compared differ
                    continue
            if len(bucket) >= _BUCKET_LIMIT:
                return self._resolve_exact(frames)
        content = (
            count,
            _frame_key(frames[0]),
            _frame_key(frames[middle]),
            _frame_key(frames[-1]),
        )
        similar = self._by_content.get(content)
        found: Attribution | None = None
        if similar is None:
            similar = self._by_content[content] = []
        else:
            found = _find(similar, frames)
            if found is None and len(similar) >= _BUCKET_LIMIT:
                # Many distinct stacks under one key (crafted input): exact keys, no scanning.
                return self._resolve_exact(frames)
        if found is None:
            found = self._resolve_new(frames)
            similar.append((frames, found))
        elif self._aliases >= _ALIASES_PER_STACK * len(self._by_content):
            # Found by content, and the identity keys are spent: frame dicts that are never
            # shared (one copy per block) would add one key per list and never be met again.
            return found
        else:
            self._aliases += 1
        # Known by identity from now on: a list met again (a block and its alloc entry), or
        # another list of the same frame dicts, is found without comparing contents.
        if bucket is None:
            self._buckets[key] = [(frames, found)]
        elif len(bucket) < _BUCKET_LIMIT:
            bucket.append((frames, found))
        return found

    def _resolve_exact(self, frames: list[Any]) -> Attribution:
        exact = tuple(map(id, frames))
        found = self._exact.get(exact)
        if found is None:
            found = self._exact[exact] = self._resolve_new(frames)
            self._pinned.append(frames)
        return found

    def _info(self, frame: object) -> _FrameInfo:
        info = self._frames.get(id(frame))
        if info is not None:
            return info
        content = _frame_key(frame)
        info = self._frame_contents.get(content)
        if info is None:
            info = self._frame_contents[content] = _classify_frame(frame)
        self._pinned.append(frame)
        self._frames[id(frame)] = info
        return info

    def _resolve_new(self, frames: list[Any]) -> Attribution:
        infos = [self._info(frame) for frame in frames]
        site = _pick_site(infos)
        for info in infos:
            if info.rule is not None:
                category, confidence, evidence = info.rule
                return Attribution(site, category, confidence, evidence)
        return Attribution(
            site, MemoryCategory.UNKNOWN, Confidence.HIGH, "no frame of the stack is recognised"
        )


def _find(bucket: list[tuple[list[Any], Attribution]], frames: list[Any]) -> Attribution | None:
    for known, attribution in bucket:
        try:
            if known == frames:
                return attribution
        except Exception:  # noqa: BLE001 - crafted items that cannot be compared differ
            continue
    return None


def _frame_key(frame: object) -> object:
    """What a frame says, as a hashable key: (filename, line, name) for a frame as torch writes
    it, else the object's identity (a crafted frame may hold unhashable values)."""
    if type(frame) is dict:
        filename = frame.get("filename")
        line = frame.get("line")
        name = frame.get("name")
        if type(filename) is str and type(line) is int and type(name) is str:
            return (filename, line, name)
    return id(frame)


# torch copies a frame's line from a C int; beyond it the number is not torch's (and past 4,300
# digits str() refuses it).
_MAX_LINE = 2**31


def _classify_frame(frame: object) -> _FrameInfo:
    if type(frame) is not dict:
        return _FrameInfo(_KIND_INVALID, None, None, False)
    filename = frame.get("filename")
    name = frame.get("name")
    line = frame.get("line")
    if (
        type(filename) is not str
        or type(name) is not str
        or type(line) is not int
        or not 0 <= line < _MAX_LINE
    ):
        return _FrameInfo(_KIND_INVALID, None, None, False)
    # Facts end up in reports: a crafted frame must not carry megabytes of text into them.
    if len(name) > _MAX_TEXT:
        name = name[:_MAX_TEXT] + "..."
    if len(filename) > _MAX_TEXT:
        filename = filename[:_MAX_TEXT] + "..."
    if _is_python_frame(filename, line):
        path = filename.replace("\\", "/")
        library = is_library_file(path)
        site = CallSite(filename, line, name, not library, False)
        return _FrameInfo(
            _KIND_LIBRARY if library else _KIND_USER, site, _python_rule(path, name), False
        )
    # Judge by the qualified name alone: argument lists mention std::, c10:: ... everywhere.
    head = name.replace("(anonymous namespace)", "").split("(", 1)[0]
    plumbing = any(token in head for token in _NATIVE_PLUMBING) or "Register" in filename
    native_site = None if plumbing or not head else CallSite(filename, line, name, False, True)
    is_node = head.endswith("::apply") and ("Backward" in head or "AccumulateGrad" in head)
    return _FrameInfo(_KIND_NATIVE, native_site, _native_rule(head), is_node)


def _pick_site(infos: list[_FrameInfo]) -> CallSite | None:
    first_library: CallSite | None = None
    first_node: CallSite | None = None
    first_native: CallSite | None = None
    for info in infos:
        if info.kind == _KIND_USER:
            return info.site
        if info.kind == _KIND_LIBRARY:
            if first_library is None:
                first_library = info.site
        elif info.kind == _KIND_NATIVE:
            if info.is_backward_node and first_node is None:
                first_node = info.site
            elif first_native is None and info.site is not None:
                first_native = info.site
    return first_library or first_node or first_native
