"""The ctypes boundary to llama.cpp (through llama-cpp-python's bindings) and ggml.

Everything that touches C handles of llama.cpp lives here or in stage.py. Library code raises
LlamaError with what failed; nothing here prints. llama.cpp's own log is kept (the last lines
explain a failed load) and logged line by line at DEBUG (`pipeinfer -vv` shows it).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import logging
import os
import threading
from pathlib import Path
from typing import Callable

import llama_cpp
import numpy as np
from gguf import GGMLQuantizationType

from .. import _native


class LlamaError(RuntimeError):
    """llama.cpp refused or failed an operation; the message says which."""


log = logging.getLogger(__name__)

# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 cont
_LOG_ERROR = 4
_log_tail: collections.deque[str] = collections.deque(maxlen=50)
_log_line: list[str] = []  # llama.cpp writes a line in pieces (e.g. progress dots)
_log_lock = threading.Lock()


@llama_cpp.llama_log_callback
def _log_callback(level, text, user_data):
    message = text.decode("utf-8", "replace") if text else ""
    _log_tail.append(message)
    # PIPEINFER_LLAMA_ERRORS: llama.cpp's errors as notices, whatever the verbosity
    shown = logging.WARNING if level == _LOG_ERROR and os.environ.get(
        "PIPEINFER_LLAMA_ERRORS") else logging.DEBUG
    if log.isEnabledFor(shown):
        _log_lines(shown, message)


def _log_lines(level: int, message: str) -> None:
    """Log the lines `message` completes, keeping an unfinished one for the next call."""
    with _log_lock:
        *lines, rest = "".join(_log_line + [message]).split("\n")
        _log_line[:] = [rest] if rest else []
    for line in lines:
        log.log(level, "llama.cpp: %s", line)


def recent_log(lines: int = 5) -> str:
    """The last lines llama.cpp logged: the reason behind a failed load, usually."""
    text = "".join(list(_log_tail)[-lines:]).strip()
    return " ".join(text.split())


_init_lock = threading.Lock()
_initialized = False


def init() -> None:
    """Initialise the llama.cpp backend once per process and route its log through us."""
    global _initialized
    with _init_lock:
        if not _initialized:
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialized = True


def system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", "replace")


def amx_compiled() -> bool:
    """True if this llama.cpp was built with AMX kernels (the -march=native default on CPUs that
    report AMX). Their repacked buffers crash on machines whose AMX tiles do not work, so model
    loads then turn off extra buffer types (and with them weight repacking)."""
    return "AMX_INT8 = 1" in system_info()


def repacks(asked: bool) -> bool:
    """Whether a model loaded with repacking `asked` gets repacked weights: not with an AMX
    build, whatever is asked (see amx_compiled)."""
    return asked and not amx_compiled()


@contextlib.contextmanager
def llama_repacking(enabled: bool):
    """Within: models that llama-cpp-python's `Llama` loads are repacked or not (it has no
    switch of its own; a single-node reference must use the weight layout of the stages it is
    compared with)."""
    import llama_cpp.llama_cpp as bindings  # the module whose function `Llama` calls

    original = bindings.llama_model_default_params

    def params():
        p = original()
        p.use_extra_bufts = repacks(enabled)
        return p

    bindings.llama_model_default_params = params
    try:
        yield
    finally:
        bindings.llama_model_default_params = original


def _lib_dir() -> Path:
    return Path(llama_cpp.__file__).resolve().parent / "lib"


def _load_ggml_base() -> ctypes.CDLL:
    names = ["libggml-base.so", "libggml-base.dylib", "ggml-base.dll"]
    for name in names:
        path = _lib_dir() / name
        if path.exists():
            return ctypes.CDLL(str(path))
    raise LlamaError(f"libggml-base not found in {_lib_dir()}; reinstall llama-cpp-python")


ggml_base = _load_ggml_base()
for _fn in ("ggml_get_name", "ggml_nbytes", "ggml_backend_tensor_get"):
    if not hasattr(ggml_base, _fn):
        raise LlamaError(f"{_fn} is not exported by libggml-base; unsupported llama.cpp build")


def ggml_function_addresses() -> tuple[int, int, int]:
    """Addresses of ggml_get_name, ggml_nbytes, ggml_backend_tensor_get for the native callbacks."""
    return tuple(ctypes.cast(getattr(ggml_base, n), ctypes.c_void_p).value  # type: ignore[return-value]
                 for n in ("ggml_get_name", "ggml_nbytes", "ggml_backend_tensor_get"))


EVAL_CALLBACK_ADDRESS, ABORT_CALLBACK_ADDRESS = _native.callback_addresses()


def dequantize_rows(raw: np.ndarray, ggml_type: GGMLQuantizationType, n_cols: int) -> np.ndarray:
    """Rows of a GGUF tensor (its raw bytes, one row per line) as float32, converted by ggml's
    own row routines so the values are exactly what llama.cpp's get_rows produces."""
    n_rows = raw.shape[0]
    out = np.empty((n_rows, n_cols), dtype=np.float32)
    if ggml_type == GGMLQuantizationType.F32:
        out[:] = raw.view(np.float32).reshape(n_rows, n_cols)
        return out
    src = np.ascontiguousarray(raw)
    row_converter(ggml_type)(src.ctypes.data, out.ctypes.data, n_rows * n_cols)
    return out


@functools.cache
def row_converter(ggml_type: GGMLQuantizationType) -> Callable[[int, int, int], None]:
    """ggml's routine that converts `n` values of `ggml_type` to float32: (source address,
    destination address, n). Looked up once per type: the head embeds tokens per run."""
    if ggml_type == GGMLQuantizationType.F16:
        fn = ggml_base.ggml_fp16_to_fp32_row
    elif ggml_type == GGMLQuantizationType.BF16:
        fn = ggml_base.ggml_bf16_to_fp32_row
    else:
        name = ggml_type.name.lower()  # ggml's symbols: dequantize_row_q4_0, ..._q4_K, ..._iq4_xs
        name = name[:-1] + "K" if name.endswith("_k") else name
        fn = getattr(ggml_base, f"dequantize_row_{name}", None)
        if fn is None:
            raise LlamaError(f"cannot dequantize tensor type {ggml_type.name}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    return fn
