"""DLPack capsules over ringfeed's exported tensors, for torch, numpy or any DLPack consumer."""

import ctypes

from ._lib import DLManagedTensor, K_DL_CPU, K_DL_CUDA

_api = ctypes.pythonapi
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

_NAME = b"dltensor"


@_DESTRUCTOR
def _capsule_destructor(capsule):
    # A consumer renames the capsule to "used_dltensor" and owns the tensor from then on; a
    # capsule nobody consumed still owns it and must hand it back to ringfeed.
    if _api.PyCapsule_IsValid(capsule, _NAME):
        ptr = _api.PyCapsule_GetPointer(capsule, _NAME)
        managed = ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor))
        managed.contents.deleter(managed)


def capsule(managed_ptr):
    """A "dltensor" capsule owning MANAGED_PTR (a POINTER(DLManagedTensor))."""
    addr = ctypes.cast(managed_ptr, ctypes.c_void_p).value
    return _api.PyCapsule_New(addr, _NAME, _capsule_destructor)


class DLPackTensor:
    """A zero-copy tensor for frameworks that speak DLPack (numpy.from_dlpack, torch.from_dlpack,
    cupy, jax): the batch memory stays with the loader until the consumer frees it."""

    def __init__(self, managed_ptr):
        t = managed_ptr.contents.dl_tensor
        self.shape = tuple(t.shape[i] for i in range(t.ndim))
        self.device = (t.device.device_type, t.device.device_id)
        self._managed = managed_ptr
        self._taken = False

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if self._taken:
            raise BufferError("ringfeed: this tensor was already handed to a consumer")
        self._taken = True
        return capsule(self._managed)

    def __del__(self):
        if not getattr(self, "_taken", True):
            self._taken = True
            self._managed.contents.deleter(self._managed)

    def __repr__(self):
        kind = {K_DL_CPU: "cpu", K_DL_CUDA: "cuda"}.get(self.device[0], str(self.device[0]))
        return f"DLPackTensor(shape={self.shape}, device={kind}:{self.device[1]})"
