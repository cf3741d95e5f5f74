"""Both validators (DeepSpeed's own models, oomlens' restatement) agree, and the hazards fire."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oomlens.analysis.config_hazards import find_config_hazards
from oomlens.analysis.ds_resolve import ResolutionContext, resolve_effective_config
from oomlens.analysis.ds_validation import (
    validate,
    validate_with_deepspeed,
    validate_with_oomlens,
)
from oomlens.facts.config import ConfigDocument, ConfigSeverity
from oomlens.facts.ds_keys import KNOWN_TOP_LEVEL_KEYS, REMOVED_TOP_LEVEL_KEYS, REMOVED_ZERO_KEYS
from oomlens.facts.ds_schema import (
    BF16,
    FP16,
    LEAF_MODULE,
    OFFLOAD_OPTIMIZER,
    OFFLOAD_PARAM,
    ZENFLOW,
    ZERO,
    ModelSpec,
)
from oomlens.ingest.ds_config import document_from_mapping, read_ds_config

ASSETS = Path(__file__).parents[1] / "assets" / "ds_configs"
REAL = {p.name: read_ds_config(p) for p in sorted(ASSETS.glob("*.json"))}
ds_installed = pytest.mark.deepspeed


@pytest.fixture(scope="module")
def deepspeed() -> Any:
    return pytest.importorskip("deepspeed.runtime.config")


# -- invalid variants, generated from the real configs ----------------------------------------


def _mutate(path: list[str], value: Any) -> Callable[[dict], dict]:
    def apply(config: dict) -> dict:
        config = copy.deepcopy(config)
        node = config
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
        return config

    return apply


def _rename(path: list[str], new: str) -> Callable[[dict], dict]:
    def apply(config: dict) -> dict:
        config = copy.deepcopy(config)
        node = config
        for key in path[:-1]:
            node = node[key]
        node[new] = node.pop(path[-1])
        return config

    return apply


Z = "zero_optimization"
MUTATIONS: dict[str, Callable[[dict], dict]] = {
    "fractional_prefetch": _mutate([Z, "stage3_prefetch_bucket_size"], 15099494.4),
    "string_bucket": _mutate([Z, "reduce_bucket_size"], "5e8"),
    "numeric_string_bucket": _mutate([Z, "reduce_bucket_size"], " 5_000 "),
    "zero_bucket": _mutate([Z, "reduce_bucket_size"], 0),
    "negative_live": _mutate([Z, "stage3_max_live_parameters"], -1),
    "infinite_reuse": _mutate([Z, "stage3_max_reuse_distance"], float("inf")),
    "huge_float": _mutate([Z, "sub_group_size"], 1e300),
    "stage_4": _mutate([Z, "stage"], 4),
    "stage_string": _mutate([Z, "stage"], "3"),
    "stage_auto": _mutate([Z, "stage"], "auto"),
    "typo_prefetch": _mutate([Z, "stage3_prefetch_bucket"], 1),
    "alias_and_name": _mutate([Z, "prefetch_bucket_size"], 7),
    "pin_typo": _mutate([Z, "offload_param"], {"device": "cpu", "pin_memroy": False}),
    "device_gpu": _mutate([Z, "offload_param"], {"device": "gpu"}),
    "device_upper": _mutate([Z, "offload_optimizer"], {"device": "CPU"}),
    "offload_string": _mutate([Z, "offload_param"], "cpu"),
    "partial_offload": _mutate([Z, "offload_optimizer"], {"device": "cpu", "ratio": 0.3}),
    "ratio_above_one": _mutate([Z, "offload_optimizer"], {"device": "cpu", "ratio": 1.5}),
    "nvme_path_number": _mutate([Z, "offload_param"], {"device": "nvme", "nvme_path": 5}),
    "bool_overlap_two": _mutate([Z, "overlap_comm"], 2),
    "bool_overlap_yes": _mutate([Z, "overlap_comm"], "yes"),
    "deprecated_conflict": _mutate([Z, "cpu_offload"], True),
    "deprecated_false_conflict": _mutate([Z, "cpu_offload"], False),
    "gather_conflict": _mutate([Z, "stage3_gather_fp16_weights_on_model_save"], True),
    "compute_grad_norm": _mutate([Z, "compute_grad_norm"], False),
    "leaf_module_bad": _mutate([Z, "leaf_module"], {"classes": ["a", 1], "bogus": 2}),
    "zenflow_ratio": _mutate([Z, "zenflow"], {"topk_ratio": 2}),
    "removed_mics": _mutate([Z, "mics_shard_size"], 2),
    "removed_block": _mutate(["elasticity"], {"enabled": True}),
    "zero_block_string": _mutate([Z], "auto"),
    "legacy_bool": _mutate([Z], True),
    "fp16_negative_scale": _mutate(["fp16", "loss_scale"], -1),
    "fp16_bool_window": _mutate(["fp16", "loss_scale_window"], True),
    "fp16_zero_window": _mutate(["fp16"], {"enabled": True, "loss_scale_window": 0}),
    "fp16_typo": _mutate(["fp16", "enable"], True),
    "bf16_and_fp16": _mutate(["bf16"], {"enabled": True}),
    "bf16_string": _mutate(["bf16"], "auto"),
    "bf16_states_stage0": _mutate(["bf16"], {"enabled": True, "bf16_optimizer_states": True}),
    "comm_dtype": _mutate(["communication_data_type"], "int8"),
    "comm_dtype_number": _mutate(["communication_data_type"], 5),
    "allreduce_sum": _mutate(["gradient_allreduce_op"], "sum"),
    "allreduce_max": _mutate(["gradient_allreduce_op"], "max"),
    "tag_validation": _mutate(["checkpoint"], {"tag_validation": "Sometimes"}),
    "batch_mismatch": _mutate(["train_batch_size"], 30),
    "batch_auto": _mutate(["train_batch_size"], "auto"),
    "micro_zero": _mutate(["train_micro_batch_size_per_gpu"], 0),
    "batch_float": _mutate(["train_batch_size"], 32.5),
    "micro_zero_derive": lambda c: {
        **{k: v for k, v in c.items() if k != "gradient_accumulation_steps"},
        "train_micro_batch_size_per_gpu": 0,
    },
    "misspelled_zero": _rename([Z], "zero_optimisation"),
}

# A consistent batch at 8 GPUs (and at no other world size for the all-three-given configs).
BASE_BATCH = {
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
}


def _cases() -> list[tuple[str, dict]]:
    cases: list[tuple[str, dict]] = [(name, doc.data) for name, doc in REAL.items()]
    base = copy.deepcopy(REAL["deepspeed_sdma_allgather_zero3_nosdma.json"].data)
    del base[Z]["sdma_allgather"]  # a key newer than 0.19.8: the rest is a valid zero-3 config
    base.update(BASE_BATCH)
    cases.append(("base", base))
    cases += [(f"base+{name}", mutate(base)) for name, mutate in MUTATIONS.items()]
    zero2 = copy.deepcopy(REAL["dse_megatron_zero2.json"].data)
    cases += [(f"zero2+{name}", mutate(zero2)) for name, mutate in MUTATIONS.items()]
    return cases


CASES = _cases()


def _verdict(problems: list) -> list[tuple[str, str]]:
    return sorted((p.code, p.key_path) for p in problems)


@ds_installed
@pytest.mark.parametrize("world_size", [None, 1, 8])
@pytest.mark.parametrize(("name", "config"), CASES, ids=[c[0] for c in CASES])
def test_both_validators_agree(
    deepspeed: Any, name: str, config: dict, world_size: int | None
) -> None:
    # GIVEN a real config or an invalid variant generated from one
    doc = document_from_mapping(config, name)
    # WHEN both validators judge it
    theirs = _verdict(validate_with_deepspeed(doc, world_size=world_size))
    ours = _verdict(validate_with_oomlens(doc, world_size=world_size))
    # THEN they reject exactly the same keys for the same reasons
    assert ours == theirs


def test_the_variants_cover_every_verdict_kind() -> None:
    # The agreement test is only as good as its cases: they must exercise each kind of problem.
    codes = {
        code
        for _, config in CASES
        for code, _ in _verdict(validate_with_oomlens(document_from_mapping(config), world_size=8))
    }
    assert {
        "int_from_float",
        "int_parsing",
        "greater_than",
        "greater_than_equal",
        "finite_number",
        "int_parsing_size",
        "enum",
        "extra_forbidden",
        "model_type",
        "path_type",
        "bool_parsing",
        "assertion_error",
        "value_error",
        "less_than_equal",
        "deprecated_conflict",
        "string_type",
        "removed_key",
        "block_type",
        "precision_conflict",
        "invalid_value",
        "batch_mismatch",
        "batch_type_error",
        "batch_zero_division",
        "batch_missing",
    } <= codes
    valid = [
        name
        for name, config in CASES
        if not validate_with_oomlens(document_from_mapping(config), world_size=8)
    ]
    assert "base" in valid and "base+stage_string" in valid and "base+misspelled_zero" in valid


@pytest.mark.parametrize(
    ("name", "key_path"),
    [
        ("dse_megatron_zero3.json", "zero_optimization.stage3_param_persitence_threshold"),
        ("dse_megatron_zero3_infinity.json", "zero_optimization.stage3_param_persitance_threshold"),
        ("dse_megatron_zero_offload_10B.json", "zero_optimization.comm_overlap"),
        ("deepspeed_sdma_allgather_zero3_nosdma.json", "zero_optimization.sdma_allgather"),
    ],
)
def test_real_configs_with_unknown_keys_are_refused_with_their_line(
    name: str, key_path: str
) -> None:
    problems = validate(REAL[name], world_size=None)
    match = [p for p in problems if p.key_path == key_path]
    assert len(match) == 1
    assert match[0].code == "extra_forbidden"
    lines = (ASSETS / name).read_text().splitlines()
    key = key_path.rsplit(".", 1)[1]
    assert match[0].source is not None
    assert f'"{key}"' in lines[match[0].source.line - 1]
    assert match[0].message == "Extra inputs are not permitted"


def test_batch_is_judged_at_the_world_size() -> None:
    doc = REAL["dse_megatron_zero2.json"]  # train_batch_size 16, gradient_accumulation_steps 1
    assert validate_with_oomlens(doc, world_size=4) == []
    problems = validate_with_oomlens(doc, world_size=32)
    assert _verdict(problems) == [("batch_nonpositive", "train_micro_batch_size_per_gpu")]
    assert problems[0].message == "Micro batch size per gpu: 0 has to be greater than 0"
    # Unknown world size: only what fails at every world size is reported.
    assert validate_with_oomlens(doc, world_size=None) == []
    auto = REAL["dse_autotuning_fp16_z3.json"]
    assert _verdict(validate_with_oomlens(auto, world_size=None)) == [
        ("batch_type_error", "train_micro_batch_size_per_gpu")
    ]


def test_validate_falls_back_to_oomlens_without_deepspeed() -> None:
    problems = validate(REAL["dse_megatron_zero3.json"], prefer_deepspeed=False)
    assert problems and all(p.validator == "oomlens" for p in problems)


# -- the restatement against DeepSpeed's source ------------------------------------------------


@ds_installed
@pytest.mark.parametrize(
    ("spec", "model_path"),
    [
        (ZERO, "deepspeed.runtime.zero.config:DeepSpeedZeroConfig"),
        (OFFLOAD_PARAM, "deepspeed.runtime.zero.offload_config:DeepSpeedZeroOffloadParamConfig"),
        (
            OFFLOAD_OPTIMIZER,
            "deepspeed.runtime.zero.offload_config:DeepSpeedZeroOffloadOptimizerConfig",
        ),
        (LEAF_MODULE, "deepspeed.runtime.zero.leaf_module_config:DeepSpeedZeroLeafModuleConfig"),
        (ZENFLOW, "deepspeed.runtime.zenflow.zenflow_config:ZenFlowConfig"),
        (FP16, "deepspeed.runtime.precision_config:DeepSpeedFP16Config"),
        (BF16, "deepspeed.runtime.precision_config:DeepSpeedBF16Config"),
    ],
)
def test_schema_fields_defaults_and_aliases_are_deepspeeds(
    spec: ModelSpec, model_path: str
) -> None:
    import importlib

    module_name, class_name = model_path.split(":")
    model = getattr(importlib.import_module(module_name), class_name)
    fields = model.model_fields
    # same fields, in the same order (pydantic reports errors in field order)
    assert [f.name for f in spec.fields] == list(fields)
    for field_spec in spec.fields:
        info = fields[field_spec.name]
        assert field_spec.alias == info.alias, field_spec.name
        if field_spec.kind == "model":
            continue
        default = info.get_default(call_default_factory=True)
        if isinstance(default, list):
            default = tuple(default)
        assert field_spec.default == default, field_spec.name


@ds_installed
def test_known_top_level_keys_cover_every_key_deepspeed_reads(deepspeed: Any) -> None:
    # GIVEN a dict that records which keys DeepSpeedConfig looks up
    seen: set[str] = set()

    class Recording(dict):
        def get(self, key: Any, *default: Any) -> Any:
            seen.add(key)
            return super().get(key, *default)

        def __contains__(self, key: object) -> bool:
            seen.add(str(key))
            return super().__contains__(key)

        def __getitem__(self, key: Any) -> Any:
            seen.add(key)
            return super().__getitem__(key)

        def __copy__(self) -> Recording:
            return Recording(self)

    # WHEN DeepSpeed builds its config from it
    deepspeed.DeepSpeedConfig(
        Recording({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8})
    )
    # THEN oomlens knows every one of them (the rest are removed blocks DeepSpeed refuses)
    assert seen - set(REMOVED_TOP_LEVEL_KEYS) <= KNOWN_TOP_LEVEL_KEYS


@ds_installed
def test_removed_key_tables_are_deepspeeds(deepspeed: Any) -> None:
    assert set(REMOVED_TOP_LEVEL_KEYS) == set(deepspeed._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    assert set(REMOVED_ZERO_KEYS) == set(deepspeed._REMOVED_ZERO_CONFIG_KEYS)


# -- hazards -----------------------------------------------------------------------------------


def _hazards(data: dict, integration: str | None = None, **context: Any) -> dict[str, Any]:
    doc = document_from_mapping(data)
    effective = resolve_effective_config(doc, ResolutionContext(**context))
    return {h.code: h for h in find_config_hazards(doc, effective, integration=integration)}


def _doc_hazards(doc: ConfigDocument, integration: str | None = None) -> dict[str, Any]:
    effective = resolve_effective_config(doc)
    return {h.code: h for h in find_config_hazards(doc, effective, integration=integration)}


def test_misspelled_zero_optimization_is_called_out_as_stage_0() -> None:
    data = MUTATIONS["misspelled_zero"](REAL["dse_megatron_zero2.json"].data)
    hazard = _hazards(data)["misspelled_top_level_key"]
    assert hazard.severity is ConfigSeverity.HIGH
    assert "'zero_optimisation'" in hazard.message and "stage 0" in hazard.message
    assert hazard.key_paths == ("zero_optimisation",)


def test_unknown_key_without_a_close_match_is_info() -> None:
    hazard = _hazards({"train_batch_size": 8, "my_custom_setting": 1})["unknown_top_level_key"]
    assert hazard.severity is ConfigSeverity.INFO


def test_auto_outside_hf_explains_the_consequences() -> None:
    doc = REAL["hf_transformers_ds_config_zero3.json"]
    direct = _doc_hazards(doc, integration="deepspeed")["auto_outside_hf"]
    assert direct.severity is ConfigSeverity.HIGH
    assert "TypeError" in direct.message and "fp32" in direct.message
    assert "zero_optimization.reduce_bucket_size" in direct.message
    unknown = _doc_hazards(doc)["auto_outside_hf"]
    assert unknown.severity is ConfigSeverity.LOW
    under_hf = _doc_hazards(doc, integration="hf")
    assert (
        "auto_outside_hf" not in under_hf
        and under_hf["auto_unresolved"].severity is ConfigSeverity.INFO
    )


def test_stage_auto_falls_back_to_stage_0() -> None:
    hazard = _hazards(
        {"train_batch_size": 8, "zero_optimization": {"stage": "auto"}}, integration="deepspeed"
    )["auto_outside_hf"]
    assert "ZeRO falls back to stage 0" in hazard.message


def test_fp32_fallback_and_deprecated_keys() -> None:
    found = _doc_hazards(REAL["deepspeed_autotuning_template_zero3.json"])
    assert found["fp32_fallback"].severity is ConfigSeverity.LOW
    deprecated = _doc_hazards(REAL["hf_transformers_ds_config_zero3.json"])["deprecated_key"]
    assert deprecated.key_paths == ("zero_optimization.stage3_gather_fp16_weights_on_model_save",)
    text = (ASSETS / "hf_transformers_ds_config_zero3.json").read_text().splitlines()
    assert '"stage3_gather_fp16_weights_on_model_save"' in text[deprecated.sources[0].line - 1]
    assert "fp32_fallback" not in _doc_hazards(REAL["dse_megatron_zero2.json"])


def test_engine_start_failures_are_hazards() -> None:
    nvme = _hazards({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})
    assert nvme["nvme_without_path"].severity is ConfigSeverity.HIGH
    odd = _hazards({"zero_optimization": {"stage": 2, "allgather_bucket_size": 5e8 + 1}})
    assert "allgather_bucket_size_odd" in odd
    below = _hazards({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    assert below["offload_param_below_stage3"].severity is ConfigSeverity.MEDIUM
    assert "offload_param_below_stage3" not in _hazards(
        {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
    )


def test_read_and_check_bundles_everything_for_the_rules() -> None:
    from oomlens.analysis.ds_validation import read_and_check

    reading = read_and_check(
        REAL["hf_transformers_ds_config_zero3.json"],
        context=ResolutionContext(integration="deepspeed"),
        world_size=8,
    )
    assert not reading.is_valid
    assert {p.code for p in reading.problems} == {"batch_type_error"}
    assert {h.code for h in reading.hazards} >= {"auto_outside_hf", "deprecated_key"}
    assert (
        reading.effective.zero.stage.value == 3
        and reading.raw is REAL["hf_transformers_ds_config_zero3.json"].data
    )
