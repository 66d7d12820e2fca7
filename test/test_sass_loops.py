"""scripts/sass_loops.py's reading of a cuobjdump listing (the notes' SASS instruction counts come from it): the
entries and their instructions, and the longest loop, not a cold path's jump back into one. CPU only, on a listing
written here in cuobjdump's format (the tool itself needs nvcc and cuobjdump, which CI does not have)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import sass_loops  # noqa: E402


def _listing(name: str, body: list) -> str:
    lines = [f"\t\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)\""]
    for i, text in enumerate(body):
        lines.append(f"        /*{16 * i:04x}*/                   {text} ;"
                     f"                                 /* 0x000fe200078e00ff */")
        lines.append("                                                                                  "
                     "/* 0x000fe200078e00ff */")
    return "\n".join(lines) + "\n"


# Addresses 0x0 .. : a 3-instruction prologue, a loop 0x30..0x80 (6 instructions, its branch at 0x80), an exit,
# and a cold path at 0xa0 that returns into the middle of the loop (to 0x50): nvcc's divergent-branch fallback.
BODY = ["S2R R0, SR_TID.X", "IMAD.MOV.U32 R1, RZ, RZ, RZ", "ISETP.GE.AND P0, PT, R0, 0x10, PT",
        "LOP3.LUT R2, R0, 0xf, R3, 0xea, !PT", "FADD R2, R2, -8388616", "FFMA R4, R2, R5, R4",
        "IADD3 R0, R0, 0x20, RZ", "ISETP.LT.AND P1, PT, R0, R6, PT", "@P1 BRA 0x30",
        "EXIT", "WARPSYNC 0xffffffff", "BRA 0x50"]


def test_the_listing_is_read_into_entries_and_instructions():
    found = sass_loops.functions(_listing("kernel_a", BODY) + _listing("kernel_b", BODY[:3] + ["EXIT"]))
    assert set(found) == {"kernel_a", "kernel_b"}
    assert [op for _, op, _ in found["kernel_a"]][:4] == ["S2R", "IMAD", "ISETP", "LOP3"]   # suffixes dropped
    assert found["kernel_a"][8] == (0x80, "BRA", "0x30")                                   # the predicate too
    assert len(found["kernel_b"]) == 4


def test_the_longest_loop_is_the_loop_not_a_cold_path_back_into_it():
    instructions = sass_loops.functions(_listing("k", BODY))["k"]
    assert sass_loops.loops(instructions) == [(0x30, 0x80)]          # 0xb0 -> 0x50 re-enters the loop: dropped
    start, end, count, ops = sass_loops.longest_loop(instructions)
    assert (start, end, count) == (0x30, 0x80, 6)
    assert ops == {"LOP3": 1, "FADD": 1, "FFMA": 1, "IADD3": 1, "ISETP": 1, "BRA": 1}
    assert sass_loops.longest_loop(instructions[:3])[:3] == (None, None, 0)                # no loop
