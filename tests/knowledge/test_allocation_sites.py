"""``oomlens.knowledge.allocation_sites``: a failing request at a reviewed DeepSpeed site bounds
the rank's partition from below; ZeRO-3's optimizer file names its stage."""

from __future__ import annotations

import json
from pathlib import Path

from oomlens.knowledge import allocation_sites
from oomlens.knowledge.allocation_sites import (
    allocation_site,
    partition_elements_at_least,
    zero_stage_of,
)

SITE_PACKAGES = "/opt/torch/.venv/lib/python3.12/site-packages/"


def test_a_request_in_the_fp32_partition_copy_is_four_bytes_an_element() -> None:
    frame = SITE_PACKAGES + "deepspeed/runtime/zero/stage3.py"
    assert (
        partition_elements_at_least(frame, "_create_fp32_partitions", 5 * 2**30) == 2**30 * 5 // 4
    )
    # a Windows path or a checkout's folder in front of the package does not matter
    assert allocation_site(
        "C:\\env\\deepspeed\\runtime\\zero\\stage3.py", "_create_fp32_partitions"
    )
    # another function of the same file, or the same name in another file, is no site
    assert partition_elements_at_least(frame, "_create_fp16_partitions", 2**30) is None
    assert (
        partition_elements_at_least("mydeepspeed/stage3.py", "_create_fp32_partitions", 4) is None
    )


def test_only_zero3s_optimizer_file_names_a_stage() -> None:
    assert zero_stage_of(SITE_PACKAGES + "deepspeed/runtime/zero/stage3.py") == 3
    assert zero_stage_of(SITE_PACKAGES + "deepspeed/runtime/zero/stage_1_and_2.py") is None
    assert zero_stage_of(SITE_PACKAGES + "deepspeed/runtime/engine.py") is None


def test_every_site_names_a_function_of_the_library_version_it_was_read_in() -> None:
    # reviewed data: each entry says where it was read; the function exists in DeepSpeed's
    # source when the package is installed here (the optional extra)
    data = json.loads(
        (Path(allocation_sites.__file__).with_name(allocation_sites.DATA)).read_text()
    )
    try:
        import deepspeed
    except ImportError:
        deepspeed = None
    for site in data["sites"]:
        assert site["library"] and site["version"] and site["what"]
        assert site["bytes_per_element"] in (2, 4)
        if deepspeed is not None and deepspeed.__version__ == site["version"]:
            source = Path(deepspeed.__file__).parent.parent / site["file"]
            assert f"def {site['function']}(" in source.read_text()
