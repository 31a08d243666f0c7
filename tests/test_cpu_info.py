"""dcoco.models.cpu.cpu_info: the one reader of the CPU's model name and flags."""

from __future__ import annotations

import platform

from dcoco.models.cpu.cpu_info import cpu_info


def test_the_first_model_name_and_flags_lines_are_read(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f\n\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
    )
    info = cpu_info(str(path))
    assert info.model == "AMD EPYC"
    assert info.flags == frozenset({"fpu", "avx2", "avx512f"})


def test_without_a_cpuinfo_the_platform_names_the_cpu(tmp_path):
    info = cpu_info(str(tmp_path / "missing"))
    assert info.model == (platform.processor() or platform.machine())
    assert info.flags == frozenset()
