"""``oomlens.derive.context``: one value per key, the best source first, each with where it was
read and how sure it is; a value no input shows stays absent."""

from __future__ import annotations

import functools

from oomlens.facts.context import Certainty, ContextKey, RunContext
from oomlens.session import analyze
from tests._corpus import CORPUS_DIR, case_dir, manifest

K = ContextKey
FIELD = CORPUS_DIR.parent / "field_logs"


@functools.cache
def _context(*paths: str) -> RunContext:
    return analyze(list(paths)).facts.context


def test_the_config_deepspeed_ran_with_beats_the_log() -> None:
    # a config written for 8 GPUs run on 2: DeepSpeed derived micro batch 16 from
    # train_batch_size 64 / (2 accumulation x 2 GPUs); the script's own line says 16 too
    context = _context(str(case_dir("accumulation_derived_micro")))
    micro = context.get(K.MICRO_BATCH)
    assert micro is not None and micro.value == 16
    assert micro.certainty is Certainty.DERIVED
    assert micro.origin.startswith("ds_config")
    accum = context.get(K.GRAD_ACCUM)
    assert accum is not None and accum.value == 2 and accum.certainty is Certainty.STATED
    assert context.get(K.ZERO_STAGE) is not None
    assert context.integer(K.ZERO_STAGE) == 3
    precision = context.get(K.PRECISION)
    assert precision is not None and precision.value == "bf16"
    # the log's world size and the log's sequence length
    assert context.integer(K.WORLD_SIZE) == 2
    assert context.integer(K.SEQ_LEN) == 1024


def test_the_oom_message_gives_the_limit_and_the_log_the_shape() -> None:
    context = _context(str(case_dir("activation_memory")))
    capacity = context.get(K.GPU_CAPACITY)
    assert capacity is not None and capacity.certainty is Certainty.STATED
    allowed = manifest("activation_memory")["measured"]["oom_messages_by_rank"]["1"]["allowed"]
    assert capacity.value == allowed
    assert "allowed" in capacity.origin
    assert context.integer(K.PARAMS) == 220_000_000
    assert context.integer(K.MICRO_BATCH) == 8
    assert context.integer(K.SEQ_LEN) == 4096
    # torchrun's summary names the ranks that failed: a lower bound, not a statement
    world = context.get(K.WORLD_SIZE)
    assert world is not None and world.certainty is Certainty.INFERRED


def test_a_model_name_implies_its_size_as_an_inference() -> None:
    context = _context(str(FIELD / "deepspeedexamples-380" / "paste.txt"))
    params = context.get(K.PARAMS)
    assert params is not None and params.value == 350_000_000
    assert params.certainty is Certainty.INFERRED
    assert "facebook/opt-350m" in params.origin
    assert context.integer(K.MICRO_BATCH) == 8


def test_a_trainable_count_is_not_the_model_size() -> None:
    # Unsloth's banner (HF Trainer's count): "Number of trainable parameters = 41,943,040" -
    # LoRA adapters: the model itself is larger; the count is kept as trainable, and as the
    # size only by inference, after any other source
    context = _context(str(FIELD / "unsloth-465" / "paste.txt"))
    trainable = context.get(K.TRAINABLE_PARAMS)
    assert trainable is not None and trainable.value == 41_943_040
    assert trainable.certainty is Certainty.STATED
    params = context.get(K.PARAMS)
    assert params is not None and params.certainty is Certainty.INFERRED
    assert "trainable" in params.origin


def test_a_value_no_input_shows_stays_absent() -> None:
    # nvidia-smi's "Tesla V100-SXM2..." names the card but not its memory (16 or 32 GB): no
    # capacity is guessed from it
    context = _context(str(FIELD / "deepspeed-192" / "paste.txt"))
    name = context.get(K.GPU_NAME)
    assert name is not None and name.value == "V100-SXM2"
    assert context.get(K.GPU_CAPACITY) is None
    # the fragmentation run's log states no precision, optimizer or batch
    frag = _context(str(case_dir("fragmentation")))
    for key in (K.PRECISION, K.OPTIMIZER, K.MICRO_BATCH, K.ZERO_STAGE, K.WORLD_SIZE):
        assert frag.get(key) is None, key


def test_every_value_cites_where_it_was_read() -> None:
    for case in ("accumulation_derived_micro", "activation_memory", "generation_oom"):
        for value in _context(str(case_dir(case))):
            assert value.origin
            assert value.key.value in value.cite()


def test_a_failing_request_at_a_partition_site_bounds_the_model_from_below() -> None:
    # Lightning's DeepSpeed strategy, one GPU: ZeRO-3 failed making the fp32 copy of a sub
    # group; the 5.00 GiB request is 4 bytes an element of the rank's partition
    context = _context(str(case_dir("lightning_deepspeed_states")))
    stage = context.get(K.ZERO_STAGE)
    assert stage is not None and stage.value == 3 and stage.certainty is Certainty.DERIVED
    bound = context.integer(K.PARAMS_AT_LEAST)
    assert bound is not None
    # the printed figure's rounding and the allocator's 2 MiB rounding are taken off
    assert (5 * 2**30 - 2**30 // 200 - 2 * 2**20) // 4 == bound
    # the model is a 1.3b GPT: the bound holds and is not far below
    assert 1.2e9 < bound < 1.45e9
    assert context.get(K.PARAMS) is None  # a bound is not the count


def test_a_zero3_frame_names_the_stage_without_the_config() -> None:
    # the same DeepSpeed run read from its logs alone, and with its config: the stage agrees
    alone = _context(str(case_dir("memory_leak") / "train.log"))
    with_config = _context(str(case_dir("memory_leak")))
    assert alone.integer(K.ZERO_STAGE) == with_config.integer(K.ZERO_STAGE) == 3
    assert with_config.get(K.ZERO_STAGE).certainty is Certainty.STATED  # type: ignore[union-attr]
