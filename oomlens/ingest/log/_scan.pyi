def make_matcher(
    anchors: tuple[bytes, ...], bits: tuple[int, ...], pivots: tuple[int, ...]
) -> object: ...
def scan(
    data: bytes,
    block_starts: bytes,
    prev_tail_len: int,
    matcher: object,
    tqdm: tuple[bytes, ...],
    pivots: bool = True,
) -> tuple[bytearray, ...]: ...
