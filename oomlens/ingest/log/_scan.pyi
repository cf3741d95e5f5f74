import numpy as np

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
    expected: int = -1,
    window_bytes: int = ...,
) -> tuple[bytearray, ...]: ...
def label_keys(
    data: bytes, begins: np.ndarray, ends: np.ndarray, exact: bool = False
) -> tuple[bytearray, bytearray]: ...
def grouped_sums(
    groups: np.ndarray, values: np.ndarray, index: np.ndarray
) -> list[tuple[int, int, int, int]]: ...
def close_order(
    kind: np.ndarray, consumed: np.ndarray, stream: np.ndarray, open_before: np.ndarray
) -> tuple[bytearray, bytearray, bytearray]: ...
def first_seen(values: np.ndarray) -> tuple[bytearray, bytearray]: ...
