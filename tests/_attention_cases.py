"""Input cases shared by the attention test modules (reference and fused backends)."""

import torch

SEQ = 16  # packed length (batch 1) of the cu_seqlens cases
# name -> (offsets, pattern the error must match): each names cu_seqlens and the offending values
BAD_CU_VALUES = {
    "decreasing": ([0, 10, 6, 16], r"cu_seqlens=\[0, 10, 6, 16\] is invalid: cu_seqlens\[2\]=6 < cu_seqlens\[1\]=10"),
    "first_not_zero": ([3, 8, 16], r"cu_seqlens=\[3, 8, 16\] is invalid: cu_seqlens\[0\]=3, expected 0"),
    "last_past_seq": ([0, 8, 20], r"cu_seqlens=\[0, 8, 20\] is invalid: cu_seqlens\[2\]=20 lies outside \[0, seq=16\]"),
    "inner_past_seq": ([0, 30, 16], r"cu_seqlens=\[0, 30, 16\] is invalid: cu_seqlens\[1\]=30 lies outside"),
    "negative": ([0, -4, 16], r"cu_seqlens\[1\]=-4 lies outside \[0, seq=16\]"),
    "last_before_seq": ([0, 8, 12], r"cu_seqlens=\[0, 8, 12\] is invalid: cu_seqlens\[-1\]=12, expected seq=16"),
    # a long list is shortened in the message; the problem still names the entry
    "long": ([0, *range(1, 15), 3, *range(15, 17)] + [16] * 24,
             r"cu_seqlens=\[0, 1, .*, \.\.\., .*16\] \(42 entries\) is invalid: cu_seqlens\[15\]=3 < cu_seqlens\[14\]=14"),
}
# name -> (function making the argument, pattern): type, dtype, shape and device
BAD_CU_STRUCTURE = {
    "int64": (lambda: torch.tensor([0, 16]), r"cu_seqlens must be a 1-D int32 tensor, got torch.int64 tensor of shape \(2,\)"),
    "two_dims": (lambda: torch.tensor([[0, 16]], dtype=torch.int32),
                 r"cu_seqlens must be a 1-D int32 tensor, got torch.int32 tensor of shape \(1, 2\)"),
    "list": (lambda: [0, 16], "cu_seqlens must be a 1-D int32 tensor, got list"),
    "one_entry": (lambda: torch.tensor([16], dtype=torch.int32), "cu_seqlens needs at least 2 entries, got 1"),
    "device": (lambda: torch.tensor([0, 16], dtype=torch.int32, device="meta"), "cu_seqlens is on meta, q on cpu"),
}


def bad_cu_seqlens(name):
    """(argument, pattern) of a BAD_CU_VALUES or BAD_CU_STRUCTURE case."""
    if name in BAD_CU_VALUES:
        values, pattern = BAD_CU_VALUES[name]
        return torch.tensor(values, dtype=torch.int32), pattern
    make, pattern = BAD_CU_STRUCTURE[name]
    return make(), pattern


BAD_CU_NAMES = list(BAD_CU_VALUES) + list(BAD_CU_STRUCTURE)
