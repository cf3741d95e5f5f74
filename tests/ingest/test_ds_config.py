"""Reading ds_config files and DeepSpeed's startup dump the way DeepSpeed 0.19.8 reads them."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomlens.analysis.ds_resolve import ResolutionContext, resolve_effective_config
from oomlens.errors import InputError, ResourceLimitError
from oomlens.facts import SourceRef
from oomlens.facts.config import Origin, Precision
from oomlens.facts.run import WorldSizeFact
from oomlens.ingest._jsonpos import JsonSyntaxError, parse_json_with_positions
from oomlens.ingest._pyrepr import parse_model_repr, parse_scalar
from oomlens.ingest.ds_config import (
    ConfigDumpScanner,
    document_from_mapping,
    parse_config_dump,
    parse_ds_config_text,
    read_ds_config,
    scan_log_for_config_dumps,
)

ASSETS = Path(__file__).parents[1] / "assets" / "ds_configs"
REAL_CONFIGS = sorted(ASSETS.glob("*.json"))
DUMPS = sorted(ASSETS.glob("dump_*.log"))
#: Real configs with a key DeepSpeed 0.19.8's zero_optimization model does not know (typos, a
#: key from a newer DeepSpeed): see tests/assets/ds_configs/README.md.
REFUSED_BY_DEEPSPEED = {
    "dse_megatron_zero3.json",
    "dse_megatron_zero3_infinity.json",
    "dse_megatron_zero_offload_10B.json",
    "deepspeed_sdma_allgather_zero3_nosdma.json",
}


def _hjson():
    return pytest.importorskip("hjson")


# -- files -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", REAL_CONFIGS, ids=lambda p: p.name)
def test_real_configs_decode_to_what_hjson_gives_deepspeed(path: Path) -> None:
    # GIVEN a real config, which DeepSpeed loads with hjson
    hjson = _hjson()
    # WHEN oomlens reads it
    doc = read_ds_config(path)
    # THEN the values and their types are hjson's (5e8 -> int, 1e14 -> float)
    expected = hjson.loads(path.read_text(), object_pairs_hook=dict)
    assert doc.data == expected
    assert _types(doc.data) == _types(expected)
    assert doc.syntax == "json"


def _types(value: object) -> object:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


def test_numbers_follow_hjson_integral_float_rule() -> None:
    doc = parse_ds_config_text(
        '{"a": 5e8, "b": 1e14, "c": 15099494.4, "d": 1.000000e+09, "e": 10.0, "f": -2.0, "g": 3}',
        "x.json",
    )
    assert doc.data == {
        "a": 500_000_000,
        "b": 1e14,
        "c": 15099494.4,
        "d": 1_000_000_000,
        "e": 10,
        "f": -2,
        "g": 3,
    }
    assert (
        isinstance(doc.data["b"], float)
        and isinstance(doc.data["a"], int)
        and isinstance(doc.data["e"], int)
    )


def test_key_lines_point_at_each_key() -> None:
    doc = read_ds_config(ASSETS / "dse_megatron_zero3.json")
    text = (ASSETS / "dse_megatron_zero3.json").read_text().splitlines()
    line = doc.key_lines["zero_optimization.stage3_param_persitence_threshold"]
    assert '"stage3_param_persitence_threshold"' in text[line - 1]
    assert doc.source("zero_optimization.stage") == SourceRef(
        str(ASSETS / "dse_megatron_zero3.json"), 6
    )


def test_comments_and_trailing_commas_are_accepted_like_hjson() -> None:
    hjson = _hjson()
    text = """
    // a comment
    {
      # hash comment
      "train_batch_size": 8, /* block
      comment */
      "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8,},
      "list": [1, 2,],
    }
    """
    doc = parse_ds_config_text(text, "c.json")
    assert doc.data == hjson.loads(text)
    assert doc.syntax == "json+comments"
    assert doc.key_lines["zero_optimization.stage"] == 7


@pytest.mark.parametrize(
    ("text", "line", "column", "what"),
    [
        ('{\n  "a": 1\n  "b": 2\n}', 3, 3, "expected ',' or '}'"),
        ('{\n  "a": [1, 2\n}', 3, 1, "expected ',' or ']'"),
        ('{\n  "a": tru\n}', 2, 8, "expected a value"),
        ('{\n  "a": 01\n}', 2, 9, "malformed number"),
        ('{\n  "a": "x\n}', 2, 10, "line break inside a string"),
        ('{"a": 1} {"b": 2}', 1, 10, "after the end of the top-level value"),
        ('{\n  "a": 1,\n  "b": /* never closed\n}', 3, 8, "unterminated /* comment"),
    ],
)
def test_bad_json_names_file_line_and_column(
    text: str, line: int, column: int, what: str, monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "hjson", None)  # no Hjson second chance
    with pytest.raises(InputError) as info:
        parse_ds_config_text(text, "bad.json")
    message = str(info.value)
    assert message.startswith("bad.json: ")
    assert f"line {line}, column {column}" in message
    assert what in message


def test_duplicate_keys_are_an_error_with_both_lines() -> None:
    with pytest.raises(InputError) as info:
        parse_ds_config_text(
            '{\n "zero_optimization": {\n  "stage": 2,\n  "stage": 3\n }\n}', "dup.json"
        )
    message = str(info.value)
    assert "duplicate key 'zero_optimization.stage'" in message
    assert "line 4" in message and "first at line 3" in message


def test_hjson_only_syntax_falls_back_to_hjson() -> None:
    _hjson()
    doc = parse_ds_config_text(
        '{\n  "zero_optimization": {stage: 3}\n  "fp16": {"enabled": true}\n}', "h.json"
    )
    assert doc.syntax == "hjson"
    assert doc.data == {"zero_optimization": {"stage": 3}, "fp16": {"enabled": True}}


def test_top_level_must_be_an_object() -> None:
    with pytest.raises(InputError, match="top-level value is a list"):
        parse_ds_config_text("[1, 2]", "l.json")


def test_empty_file_is_an_empty_config_as_in_hjson() -> None:
    assert parse_ds_config_text("  \n", "e.json").data == {}


def test_oversized_and_non_utf8_files_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text('{"a": "' + "x" * 2000 + '"}')
    with pytest.raises(ResourceLimitError):
        read_ds_config(big, max_bytes=1000)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{\n "a": "\xe9"\n}')
    with pytest.raises(InputError, match="line 2: not UTF-8"):
        read_ds_config(latin)
    utf16 = tmp_path / "utf16.json"  # NUL bytes, yet text saved in the wrong encoding
    utf16.write_text('{"train_batch_size": 8}', encoding="utf-16")
    with pytest.raises(InputError, match="line 1: not UTF-8"):
        read_ds_config(utf16)
    with pytest.raises(InputError, match="cannot read"):
        read_ds_config(tmp_path / "missing.json")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='{}[]",:0123456789.eE-+ \n\t/#*truefalsnul\\abc', max_size=80))
def test_reader_fails_only_with_syntax_errors_on_garbage(text: str) -> None:
    try:
        parse_json_with_positions(text)
    except JsonSyntaxError as err:
        assert err.line >= 1 and err.column >= 1


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(10**12), 10**12)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=8),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=6), children, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_reader_agrees_with_hjson_on_json(value: object) -> None:
    hjson = _hjson()
    text = json.dumps({"k": value}, indent=2)
    try:
        expected = hjson.loads(text, object_pairs_hook=dict)
    except OverflowError:
        return  # hjson crashes on floats like 1e308 that overflow int(); DeepSpeed would too
    assert parse_json_with_positions(text).value == expected


# -- resolution --------------------------------------------------------------------------------


def _effective(data: dict, **context: object):
    return resolve_effective_config(document_from_mapping(data), ResolutionContext(**context))  # type: ignore[arg-type]


def test_defaults_and_derived_values_carry_their_origin() -> None:
    eff = _effective({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}})
    z = eff.zero
    assert z.stage.value == 3 and z.stage.origin is Origin.USER
    assert (
        z.reduce_bucket_size.value == 500_000_000 and z.reduce_bucket_size.origin is Origin.DEFAULT
    )
    assert z.prefetch_bucket_size.key_path == "zero_optimization.stage3_prefetch_bucket_size"
    assert z.overlap_comm.value is True and z.overlap_comm.origin is Origin.DERIVED
    assert z.offload_optimizer.device.value == "none" and not z.offload_optimizer.enabled
    assert z.offload_param.pin_memory.value is True  # default since 0.19.5
    assert eff.precision.model_precision is Precision.BF16


def test_alias_spelling_is_kept_and_marked() -> None:
    eff = _effective(
        {
            "zero_optimization": {"stage": 3, "prefetch_bucket_size": 1000},
            "bfloat16": {"enabled": True},
        }
    )
    assert eff.zero.prefetch_bucket_size.value == 1000
    assert eff.zero.prefetch_bucket_size.origin is Origin.ALIAS
    assert eff.zero.prefetch_bucket_size.key_path == "zero_optimization.prefetch_bucket_size"
    assert eff.precision.bf16_enabled.origin is Origin.ALIAS
    assert eff.precision.bf16_enabled.key_path == "bfloat16.enabled"


def test_deprecated_keys_are_mapped() -> None:
    eff = _effective({"zero_optimization": {"stage": 2, "cpu_offload": True}})
    device = eff.zero.offload_optimizer.device
    assert device.value == "cpu" and device.origin is Origin.DEPRECATED_KEY
    assert device.key_path == "zero_optimization.cpu_offload"
    doc = read_ds_config(ASSETS / "hf_transformers_ds_config_zero3.json")
    save = resolve_effective_config(doc).zero.gather_16bit_weights_on_model_save
    assert save.value is True and save.origin is Origin.DEPRECATED_KEY


def test_legacy_boolean_zero_optimization_means_stage_1() -> None:
    eff = _effective({"zero_optimization": True, "allgather_size": 2e8})
    assert eff.zero.stage.value == 1 and eff.zero.stage.origin is Origin.DEPRECATED_KEY
    assert eff.zero.allgather_bucket_size.value == 200_000_000


def test_auto_is_unresolved_without_hidden_size_and_resolved_with_it() -> None:
    doc = read_ds_config(ASSETS / "hf_transformers_ds_config_zero3.json")
    plain = resolve_effective_config(doc)
    assert plain.zero.reduce_bucket_size.origin is Origin.AUTO_UNRESOLVED
    assert plain.zero.reduce_bucket_size.value == 500_000_000  # what DeepSpeed alone uses
    assert plain.precision.fp16_enabled.origin is Origin.AUTO_UNRESOLVED
    assert plain.precision.fp16_enabled.value is False
    assert plain.batch.train_batch_size.value == "auto"
    assert "zero_optimization.stage3_prefetch_bucket_size" in plain.auto_keys
    # WHEN the hidden size and the precision are known (the HF Trainer would fill them)
    resolved = resolve_effective_config(
        doc,
        ResolutionContext(
            hidden_size=4096, hidden_size_source="--hidden-size", precision=Precision.FP16
        ),
    )
    z = resolved.zero
    assert (
        z.reduce_bucket_size.value,
        z.prefetch_bucket_size.value,
        z.param_persistence_threshold.value,
    ) == (
        16_777_216,
        15_099_494,
        40_960,
    )
    assert z.prefetch_bucket_size.origin is Origin.AUTO_RESOLVED
    assert "hidden_size=4096" in z.prefetch_bucket_size.note
    assert resolved.precision.fp16_enabled.value is True
    # AND a config sent to DeepSpeed directly resolves nothing
    direct = resolve_effective_config(
        doc, ResolutionContext(hidden_size=4096, integration="deepspeed")
    )
    assert direct.zero.reduce_bucket_size.origin is Origin.AUTO_UNRESOLVED


def test_invalid_value_falls_back_to_default_with_a_note() -> None:
    eff = _effective({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 15099494.4}})
    value = eff.zero.prefetch_bucket_size
    assert value.value == 50_000_000 and "refuses" in value.note


@pytest.mark.deepspeed
@pytest.mark.parametrize("path", REAL_CONFIGS, ids=lambda p: p.name)
def test_effective_config_matches_deepspeeds_own_resolution(path: Path) -> None:
    # GIVEN a real config DeepSpeed accepts (autos dropped, as DeepSpeed alone does)
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config
    from deepspeed.runtime.zero.config import get_zero_config

    doc = read_ds_config(path)
    if path.name in REFUSED_BY_DEEPSPEED:
        with pytest.raises(Exception, match="Extra inputs are not permitted"):
            get_zero_config(doc.data)
        return
    ds_zero = get_zero_config(doc.data)
    ds_fp16 = get_float16_config(doc.data)
    ds_bf16 = get_bfloat16_config(doc.data)
    # WHEN oomlens resolves it
    eff = resolve_effective_config(doc, ResolutionContext(integration="deepspeed"))
    z = eff.zero
    # THEN every memory-relevant value is DeepSpeed's
    for name in (
        "stage",
        "contiguous_gradients",
        "reduce_scatter",
        "reduce_bucket_size",
        "allgather_bucket_size",
        "overlap_comm",
        "sub_group_size",
        "prefetch_bucket_size",
        "param_persistence_threshold",
        "model_persistence_threshold",
        "max_live_parameters",
        "max_reuse_distance",
        "gather_16bit_weights_on_model_save",
        "allgather_sequential",
        "zero_hpz_partition_size",
    ):
        assert getattr(z, name).value == getattr(ds_zero, name), name
    for mine, theirs in (
        (z.offload_param, ds_zero.offload_param),
        (z.offload_optimizer, ds_zero.offload_optimizer),
    ):
        if theirs is None:
            assert mine.device.value == "none"
            continue
        assert mine.device.value == theirs.device
        assert mine.pin_memory.value == theirs.pin_memory
        assert mine.buffer_count.value == theirs.buffer_count
    assert eff.precision.fp16_enabled.value == ds_fp16.enabled
    assert eff.precision.bf16_enabled.value == ds_bf16.enabled


# -- the startup dump ------------------------------------------------------------------------


def _dump(path: Path):
    dumps = list(scan_log_for_config_dumps(path))
    assert len(dumps) == 1
    return dumps[0]


@pytest.mark.parametrize("path", DUMPS, ids=lambda p: p.name)
def test_dumps_are_complete_and_their_json_part_is_read(path: Path) -> None:
    dump = _dump(path)
    assert dump.complete, dump.problems
    assert dump.user_config is not None
    assert dump.header.line == 2
    assert dump.value_of("world_size") in (2, 4, 8)
    assert "zero_config" in dump.fields


def test_dump_of_hf_config_reads_back_the_config_that_ran() -> None:
    # GIVEN the dump DeepSpeed printed for HF's zero3 config at 8 GPUs
    # (the autos filled as HF fills them for hidden size 4096)
    dump = _dump(ASSETS / "dump_hf_transformers_zero3_ws8.log")
    eff = dump.effective()
    # THEN the exact values come from the engine lines, not the lossy json (1.677722e+07)
    assert eff.zero.reduce_bucket_size.value == 16_777_216
    assert dump.user_config.data["zero_optimization"]["reduce_bucket_size"] == 16_777_220
    assert eff.zero.prefetch_bucket_size.value == 15_099_494
    assert eff.zero.prefetch_bucket_size.origin is Origin.LOG_DUMP
    assert eff.zero.prefetch_bucket_size.source.line == dump.fields["zero_config"][1].line
    assert (
        eff.zero.offload_param.device.value == "cpu"
        and eff.zero.offload_optimizer.pin_memory.value is True
    )
    assert eff.zero.gather_16bit_weights_on_model_save.value is True
    assert eff.precision.fp16_enabled.value is True
    assert (eff.batch.train_batch_size.value, eff.batch.micro_batch_per_gpu.value) == (64, 4)
    assert eff.batch.gradient_accumulation_steps.value == 2
    assert eff.world_size is not None and eff.world_size.value == 8
    assert eff.optimizer.type.value == "adamw"


@pytest.mark.parametrize(
    ("dump_name", "config_name", "context"),
    [
        ("dump_dse_megatron_zero2_ws4.log", "dse_megatron_zero2.json", {}),
        (
            "dump_hf_transformers_zero3_ws8.log",
            "hf_transformers_ds_config_zero3.json",
            {"hidden_size": 4096, "precision": Precision.FP16},
        ),
        (
            "dump_hf_accelerate_zero3_ws2.log",
            "hf_accelerate_ds_config_zero3.json",
            {"hidden_size": 1536, "precision": Precision.BF16},
        ),
    ],
)
def test_file_and_dump_resolve_to_the_same_effective_config(
    dump_name: str, config_name: str, context: dict
) -> None:
    from oomlens.analysis.batch import with_derived_batch

    dump_eff = _dump(ASSETS / dump_name).effective()
    file_eff = resolve_effective_config(
        read_ds_config(ASSETS / config_name), ResolutionContext(**context)
    )
    world = WorldSizeFact(int(dump_eff.world_size.value), "config dump")
    file_settings = with_derived_batch(file_eff, world).settings()
    dump_settings = dump_eff.settings()
    if file_eff.batch.train_batch_size.value == "auto":
        # HF fills the batch triple from TrainingArguments; only the dump knows it
        for key in (
            "batch.train_batch_size",
            "batch.micro_batch_per_gpu",
            "batch.gradient_accumulation_steps",
        ):
            file_settings.pop(key)
            dump_settings.pop(key)
    assert file_settings == dump_settings


def test_dump_lines_without_logger_prefix_and_with_noise() -> None:
    # GIVEN a real dump whose lines lost their logger prefix, with other output between them
    raw = (ASSETS / "dump_dse_megatron_zero2_ws4.log").read_text().splitlines()
    stripped = []
    for number, line in enumerate(raw, start=1):
        body = line.split("] ", 3)[-1] if line.startswith("[") else line
        stripped.append((SourceRef("run.log", number), body))
        if number % 7 == 0:
            stripped.append((SourceRef("run.log", number), "rank1: step 3 loss=2.31"))
    # WHEN the scanner reads them
    scanner = ConfigDumpScanner()
    found = [d for ref, text in stripped if (d := scanner.feed(ref, text)) is not None]
    # THEN the block is read as from the clean log
    assert len(found) == 1 and scanner.finish() is None
    assert (
        found[0].effective().settings()
        == _dump(ASSETS / "dump_dse_megatron_zero2_ws4.log").effective().settings()
    )


def test_truncated_dump_is_flagged_incomplete() -> None:
    lines = (ASSETS / "dump_hf_accelerate_zero3_ws2.log").read_text().splitlines()
    cut = [(SourceRef("x.log", i + 1), text) for i, text in enumerate(lines[:-12])]
    dump = parse_config_dump(cut[1:])
    assert not dump.complete
    assert dump.effective().zero.stage.value == 3  # the engine lines were all there


def test_json_part_with_inf_and_nan_from_deepspeeds_encoder() -> None:
    # GIVEN DeepSpeed's own encoder output for a config with inf/nan values
    encoder = pytest.importorskip("deepspeed.runtime.config_utils").ScientificNotationEncoder
    text = json.dumps(
        {
            "steps_per_print": math.inf,
            "x": math.nan,
            "zero_optimization": {"reduce_bucket_size": 5e8, "stage": 3},
        },
        cls=encoder,
        sort_keys=True,
        indent=4,
        separators=(",", ":"),
    )
    assert "inf" in text and ", \n" in text
    # WHEN it is read in dump syntax
    value = parse_json_with_positions(text, dump_syntax=True).value
    assert isinstance(value, dict)
    assert value["steps_per_print"] == math.inf and math.isnan(value["x"])
    assert value["zero_optimization"] == {"reduce_bucket_size": 500_000_000, "stage": 3}
    with pytest.raises(JsonSyntaxError):
        parse_json_with_positions(text)  # not JSON outside a dump


def test_pydantic_v1_zero_config_repr_with_thousands_separators() -> None:
    # GIVEN a zero_config line as pydantic-v1 DeepSpeed (<= 0.14) printed it: ints through pp_int's
    # repr (f"{x:,}"), nested models as Name(field=value, ...), sys.maxsize by name
    pp_int = pytest.importorskip("deepspeed.runtime.config_utils").pp_int
    offload = (
        "DeepSpeedZeroOffloadParamConfig(device='cpu', nvme_path=None, buffer_count=5, "
        f"buffer_size={pp_int(1e8)!r}, max_in_cpu={pp_int(1e9)!r}, pin_memory=False)"
    )
    line = (
        f"stage=3 contiguous_gradients=True reduce_bucket_size={pp_int(5e8)!r} overlap_comm=True "
        f"offload_param={offload} offload_optimizer=None sub_group_size={pp_int(1e9)!r} "
        f"prefetch_bucket_size={pp_int(5e7)!r} param_persistence_threshold={pp_int(1e5)!r} "
        f"model_persistence_threshold={pp_int(sys.maxsize, 'sys.maxsize')!r} "
        f"max_live_parameters={pp_int(1e9)!r}"
    )
    assert "500,000,000" in line and "sys.maxsize" in line
    # WHEN it is parsed
    fields = parse_model_repr(line)
    # THEN
    assert fields["reduce_bucket_size"] == 500_000_000
    assert fields["prefetch_bucket_size"] == 50_000_000
    assert fields["model_persistence_threshold"] == sys.maxsize
    assert fields["offload_param"] == {
        "device": "cpu",
        "nvme_path": None,
        "buffer_count": 5,
        "buffer_size": 100_000_000,
        "max_in_cpu": 1_000_000_000,
        "pin_memory": False,
    }
    assert fields["offload_optimizer"] is None


def test_pydantic_v2_repr_of_the_installed_models() -> None:
    zero = pytest.importorskip("deepspeed.runtime.zero.config")
    model = zero.DeepSpeedZeroConfig(
        stage=3,
        offload_param={"device": "nvme", "nvme_path": "/local_nvme"},
        offload_optimizer={"device": "cpu"},
    )
    fields = parse_model_repr(str(model))
    assert fields["offload_param"]["nvme_path"] == "/local_nvme"
    assert fields["offload_optimizer"]["ratio"] == 1.0
    assert fields["leaf_module"]["classes"][0].startswith("transformers.")
    assert fields["overlap_comm"] is True


def test_old_enum_repr_and_scalars() -> None:
    fields = parse_model_repr(
        "device=<OffloadDeviceEnum.cpu: 'cpu'> ratio=0.5 path=PosixPath('/x y') n=-3"
    )
    assert fields == {"device": "cpu", "ratio": 0.5, "path": "/x y", "n": -3}
    assert parse_scalar("torch.bfloat16") == "torch.bfloat16"
    assert parse_scalar("inf") == math.inf
    assert parse_scalar("5,000,000") == 5_000_000


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_repr_parser_and_scanner_never_raise_on_garbage(text: str) -> None:
    parse_model_repr(text)
    scanner = ConfigDumpScanner()
    lines = [
        "[2026-01-01 00:00:00,000] [INFO] [config.py:1:print] DeepSpeedEngine configuration:",
        text,
        "  json = {" + text,
    ]
    dumps = [d for line in lines if (d := scanner.feed(SourceRef("x"), line)) is not None]
    last = scanner.finish()
    dumps += [last] if last is not None else []
    assert dumps
    for dump in dumps:
        dump.effective()


def test_reconcile_keeps_file_provenance_and_marks_autos_filled_by_the_integration() -> None:
    from oomlens.analysis.ds_resolve import reconcile_with_dump

    # GIVEN HF's zero3 config (with "auto") and the dump of the run that used it
    file_eff = resolve_effective_config(
        read_ds_config(ASSETS / "hf_transformers_ds_config_zero3.json")
    )
    dump_eff = _dump(ASSETS / "dump_hf_transformers_zero3_ws8.log").effective()
    # WHEN they are reconciled
    merged, differences = reconcile_with_dump(file_eff, dump_eff)
    # THEN the values are what ran, the autos say so, and the rest keeps the file's line
    assert differences == ()
    prefetch = merged.zero.prefetch_bucket_size
    assert prefetch.value == 15_099_494 and prefetch.origin is Origin.AUTO_RESOLVED
    assert prefetch.key_path == "zero_optimization.stage3_prefetch_bucket_size"
    assert merged.precision.fp16_enabled.value is True
    assert merged.batch.train_batch_size.value == 64
    live = merged.zero.max_live_parameters
    assert live.origin is Origin.USER and live.source.path.endswith(
        "hf_transformers_ds_config_zero3.json"
    )
    assert merged.world_size.value == 8


def test_reconcile_lists_values_changed_after_the_run() -> None:
    from oomlens.analysis.ds_resolve import reconcile_with_dump

    data = read_ds_config(ASSETS / "dse_megatron_zero2.json").data
    edited = {**data, "zero_optimization": {"stage": 2, "reduce_bucket_size": 1e8}}
    file_eff = resolve_effective_config(document_from_mapping(edited, "edited.json"))
    dump_eff = _dump(ASSETS / "dump_dse_megatron_zero2_ws4.log").effective()
    merged, differences = reconcile_with_dump(file_eff, dump_eff)
    assert [d.setting for d in differences] == ["zero.reduce_bucket_size"]
    assert merged.zero.reduce_bucket_size.value == 500_000_000
    assert merged.zero.reduce_bucket_size.origin is Origin.LOG_DUMP
    assert merged.batch.micro_batch_per_gpu.origin is Origin.DERIVED


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="()[]{}<>'\"=,: abc019.-+_\\", max_size=40))
def test_repr_parser_terminates_on_unbalanced_brackets_and_quotes(text: str) -> None:
    # every value read consumes input: no input can make the parser loop
    parse_model_repr("a=" + text)
    parse_model_repr("a=Foo(" + text)


def test_values_cite_their_key_origin_and_line() -> None:
    doc = read_ds_config(ASSETS / "dse_megatron_zero2.json")
    eff = resolve_effective_config(doc)
    assert eff.zero.stage.cite() == f"zero_optimization.stage = 2 (user at {doc.path}:6)"
    assert (
        eff.zero.reduce_bucket_size.cite()
        == "zero_optimization.reduce_bucket_size = 500_000_000 (default)"
    )
    dumped = _dump(ASSETS / "dump_dse_megatron_zero2_ws4.log").effective().zero.stage
    assert dumped.cite().startswith("zero_optimization.stage = 2 (log dump at ")
