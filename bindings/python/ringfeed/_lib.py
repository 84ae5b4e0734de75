"""Finds and loads libringfeed.so and declares the C functions the binding calls (pure ctypes)."""

import ctypes
import ctypes.util
import os

VERSION = (0, 1)  # the DL_VERSION_MAJOR/MINOR this binding was written for


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER),
]

K_DL_CPU, K_DL_CUDA = 1, 2


def _candidates():
    env = os.environ.get("RINGFEED_LIBRARY")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libringfeed.so")
    root = os.path.abspath(os.path.join(here, "..", "..", ".."))
    for build in ("build", "build-device"):
        yield os.path.join(root, build, "libringfeed.so")
    found = ctypes.util.find_library("ringfeed")
    if found:
        yield found
    yield "libringfeed.so.0"


def _load():
    errors = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("ringfeed: libringfeed.so not found; set RINGFEED_LIBRARY to its path"
                      + ("" if not errors else " (" + "; ".join(errors) + ")"))


lib = _load()

_c = ctypes
_sig = {
    "dl_version": (_c.c_char_p, []),
    "dl_strerror": (_c.c_char_p, [_c.c_int]),
    "dl_errname": (_c.c_char_p, [_c.c_int]),
    "dl_option_exists": (_c.c_int, [_c.c_char_p]),
    "dl_last_error": (_c.c_char_p, []),
    "dl_open": (_c.c_int, [_c.POINTER(_c.c_void_p), _c.c_char_p, _c.c_char_p]),
    "dl_next_batch_on": (_c.c_int, [_c.c_void_p, _c.c_int, _c.POINTER(_c.c_void_p)]),
    "dl_next_batch_timed": (_c.c_int, [_c.c_void_p, _c.c_int, _c.c_int, _c.POINTER(_c.c_void_p)]),
    "dl_batch_size": (_c.c_int, [_c.c_void_p]),
    "dl_batch_key": (_c.c_char_p, [_c.c_void_p, _c.c_int]),
    "dl_batch_keys": (_c.POINTER(_c.c_char_p), [_c.c_void_p]),
    "dl_batch_keys_text": (_c.c_void_p, [_c.c_void_p, _c.POINTER(_c.c_size_t)]),
    "dl_batch_sample_error": (_c.c_int, [_c.c_void_p, _c.c_int]),
    "dl_batch_errors": (_c.c_int, [_c.c_void_p]),
    "dl_batch_position": (_c.c_int, [_c.c_void_p, _c.POINTER(_c.c_int64), _c.POINTER(_c.c_int64)]),
    "dl_batch_field": (_c.c_int, [_c.c_void_p, _c.c_char_p, _c.POINTER(DLTensor)]),
    "dl_batch_export": (_c.c_int, [_c.c_void_p, _c.c_char_p, _c.POINTER(_c.POINTER(DLManagedTensor))]),
    "dl_batch_wait": (_c.c_int, [_c.c_void_p, _c.c_void_p]),
    "dl_batch_copy": (_c.c_int, [_c.c_void_p, _c.c_char_p, _c.c_void_p, _c.c_size_t, _c.c_void_p]),
    "dl_batch_release": (None, [_c.c_void_p, _c.c_void_p]),
    "dl_batches_per_epoch": (_c.c_int64, [_c.c_void_p]),
    "dl_epoch_batches": (_c.c_int64, [_c.c_void_p, _c.c_int64]),
    "dl_class_name": (_c.c_char_p, [_c.c_void_p, _c.c_int64]),
    "dl_batch_bytes_count": (_c.c_int, [_c.c_void_p]),
    "dl_batch_bytes_name": (_c.c_char_p, [_c.c_void_p, _c.c_int]),
    "dl_batch_bytes": (_c.c_void_p, [_c.c_void_p, _c.c_char_p, _c.c_int, _c.POINTER(_c.c_size_t)]),
    "dl_batch_bytes_kind": (_c.c_char_p, [_c.c_void_p, _c.c_int]),
    "dl_state_save": (_c.c_int, [_c.c_void_p, _c.c_char_p, _c.c_size_t]),
    "dl_stats_json": (_c.c_int, [_c.c_void_p, _c.c_char_p, _c.c_size_t]),
    "dl_close": (None, [_c.c_void_p]),
    "dl_batch_field_count": (_c.c_int, [_c.c_void_p]),
    "dl_batch_field_name": (_c.c_char_p, [_c.c_void_p, _c.c_int]),
    "dl_writer_open": (_c.c_int, [_c.POINTER(_c.c_void_p), _c.c_char_p, _c.c_char_p]),
    "dl_writer_begin": (_c.c_int, [_c.c_void_p, _c.c_char_p, _c.c_int64]),
    "dl_writer_field": (_c.c_int, [_c.c_void_p, _c.c_char_p, _c.c_char_p, _c.c_void_p, _c.c_size_t]),
    "dl_writer_end": (_c.c_int, [_c.c_void_p]),
    "dl_writer_classes": (_c.c_int, [_c.c_void_p, _c.POINTER(_c.c_char_p), _c.c_size_t]),
    "dl_writer_close": (_c.c_int, [_c.c_void_p]),
    "dl_writer_abort": (None, [_c.c_void_p]),
}
for _name, (_res, _args) in _sig.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args

_have = tuple(int(x) for x in lib.dl_version().decode().split(".")[:2])
if _have != VERSION:
    raise ImportError(f"ringfeed: libringfeed.so is version {lib.dl_version().decode()}, "
                      f"this binding needs {VERSION[0]}.{VERSION[1]}.x")
