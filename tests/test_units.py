"""One GiB formatter (vramlab.units) for the reports, the plan text and pack's table."""

from __future__ import annotations

from vramlab.units import GIB, MIB, gib, to_gib


def test_gib_formats_with_the_unit_and_the_missing_mark() -> None:
    assert gib(12 * GIB) == "12.00" and gib(int(1.5 * GIB), 3) == "1.500"
    assert gib(None) == "–"
    assert gib(-3 * GIB, sign=True, unit=True) == "-3.00 GiB" and gib(GIB // 4, sign=True) == "+0.25"
    assert to_gib(512 * MIB) == 0.5


def test_renderers_share_it() -> None:
    from vramlab.placement import result
    from vramlab.report import calibrate_text, check_log_text, fmt, plan_text

    assert fmt.gib is gib and plan_text.gib is gib and result.gib is gib
    assert check_log_text.gib is gib and calibrate_text.gib is gib


def test_one_gib_constant_in_src():
    # GIB was defined 13 times; every module imports vramlab.units' one
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "vramlab"
    defs = [
        p.relative_to(src).as_posix()
        for p in src.rglob("*.py")
        if re.search(r"^GIB\s*=", p.read_text(), re.M)
    ]
    assert defs == ["units.py"]


def test_no_gib_formatted_by_hand_in_src():
    # one formatter: an f-string `{x / GIB:.2f} GiB` is gib(x, unit=True), so every figure reads the same way
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "vramlab"
    by_hand = [
        f"{p.relative_to(src).as_posix()}:{n}"
        for p in src.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"/ GIB:\.\d+f\}", line)
    ]
    assert by_hand == []
