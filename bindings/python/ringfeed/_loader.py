"""The Loader: options in, batches of framework tensors out, state_dict for resume."""

import contextlib
import ctypes
import json
import os
import re
import sys
import threading
import warnings
from typing import Iterator

from . import _dlpack
from ._lib import DLManagedTensor, K_DL_CUDA, lib

_DL_EOF = 1
_DL_EBUSY = -1007
_DL_EOPTION = -1005
_DL_ECLOSED = -1011
_ETIMEDOUT = -110
_EINVAL = -22
_WAIT_SLICE_MS = 50
_CREDENTIALS = re.compile(r"(://)[^/@\s]*@")  # the user:password@ of a URL, kept out of what is printed
_raw_stream = None  # torch's call for the current stream's handle, once torch has set CUDA up


class Error(RuntimeError):
    """A ringfeed failure: .code (negative), .name ("DL_ECORRUPT", "ENOENT", ...), .message."""

    def __init__(self, code, message):
        self.code = code
        self.name = lib.dl_errname(code).decode()
        self.message = message
        super().__init__(f"{self.name}: {message}")


def _check(rc):
    if rc < 0:
        raise Error(rc, (lib.dl_last_error() or b"").decode(errors="replace"))
    return rc


def version():
    return lib.dl_version().decode()


def _name(raw):
    """A key or field name from a shard, as Python's tarfile and os.fsdecode give names: bytes that
    are not UTF-8 kept as surrogates, so that name.encode("utf-8", "surrogateescape") gives them back
    and two names never become one."""
    return raw.decode("utf-8", "surrogateescape")


def _member(kind, pointer, size):
    """A member's bytes as Python takes them, by what the library says the field holds (its
    source's column type, else its name's extension): text as str, JSON parsed (left as str when
    it does not parse), anything else bytes; None when absent."""
    if not pointer:
        return None
    data = ctypes.string_at(pointer, size)
    if kind == b"text":
        return data.decode("utf-8", errors="replace")
    if kind == b"json":
        text = data.decode("utf-8", errors="replace")
        try:
            return json.loads(text)
        except ValueError:
            return text
    return data


def _format(key, value):
    if key == "dtype" and not isinstance(value, str):  # torch.float16, numpy.float16, numpy.dtype("float16")
        value = getattr(value, "__name__", None) or str(value).replace("torch.", "")
    if isinstance(value, bool):
        return "1" if value else "0"
    if key == "image_size" and isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"ringfeed: image_size={tuple(value)!r}: give one size or (height, width)")
        return f"{value[0]}x{value[1]}"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    text = os.fsdecode(value) if isinstance(value, (bytes, os.PathLike)) else str(value)
    if not text or (any(c.isspace() for c in text) and '"' in text):
        raise ValueError(f"ringfeed: option {key}={text!r} may not be empty, nor hold both spaces and quotes")
    return f'"{text}"' if any(c.isspace() for c in text) else text  # a path with spaces, quoted


_INSTALL = {"numpy": "pip install numpy (Debian and Ubuntu: apt install python3-numpy)",
            "torch": "pip install torch (see pytorch.org for the build of your CUDA)"}


def _needs(module):
    """MODULE imported, or an ImportError that says how to install it."""
    try:
        return __import__(module)
    except ImportError:
        raise ImportError(f"ringfeed: framework={module!r} needs {module}: {_INSTALL[module]}; "
                          "framework='dlpack' needs nothing") from None


def _framework(name):
    if name is None:
        try:
            import torch  # noqa: F401
            return "torch"
        except ImportError:
            pass
        try:
            import numpy  # noqa: F401
            return "numpy"
        except ImportError:
            return "dlpack"
    if name not in ("torch", "numpy", "dlpack"):
        raise ValueError(f"ringfeed: framework={name!r}: expected torch, numpy or dlpack")
    return name


class Writer:
    """Writes a ringfeed shard (.rfs): records of named fields, each "raw", "zstd" (compressed
    here), "jpeg", "png", "webp", "bytes", "text" (a str, read back as one) or "json" (any value
    json.dumps takes, read back parsed). Tensor fields are .npy payloads; numpy arrays are saved
    as such. An image field ("jpeg", "png", "webp") takes the encoded file's bytes.

        with ringfeed.Writer("train-000000.rfs", classes=["cat", "dog"]) as w:
            w.add("000123", label=1, fields={"image": ("jpeg", jpeg_bytes), "depth": ("zstd", array)})

    CLASSES, where given, names the labels (label i is classes[i]); a Loader over the shard gives
    them back as `loader.classes`, as it does an ImageFolder's.
    """

    def __init__(self, path, align=4096, zstd_level=3, classes=None):
        self._handle = ctypes.c_void_p()
        opts = f"align={int(align)} zstd_level={int(zstd_level)}".encode()
        names = None
        if classes is not None:
            if isinstance(classes, (str, bytes)):
                raise TypeError("ringfeed: classes is a list of class names, not one name")
            names = [self._text("class name", c) for c in classes]
        _check(lib.dl_writer_open(ctypes.byref(self._handle), os.fsencode(path), opts))
        if names:
            try:
                _check(lib.dl_writer_classes(self._handle, (ctypes.c_char_p * len(names))(*names), len(names)))
            except BaseException:
                self.abort()
                raise

    @staticmethod
    def _payload(value, codec="raw"):
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if codec in ("jpeg", "png", "webp"):  # as numpy.save would store it, no reader could decode it
            raise TypeError(f"ringfeed: a {codec} field takes the encoded file's bytes, not {type(value).__name__}: "
                            f"encode the image first (PIL: image.save(buffer, format={codec.upper()!r})), or store "
                            "an array with codec 'raw'")
        if codec == "text":
            if not isinstance(value, str):
                raise TypeError(f"ringfeed: a text field takes a str (or bytes), not {type(value).__name__}")
            return value.encode()
        if codec == "json":
            import json
            return json.dumps(value).encode()
        if isinstance(value, str):  # numpy would store a string array, which no reader takes
            raise TypeError(f"ringfeed: a {codec} field takes an array or bytes, not str: give ('text', value) for text")
        import io
        import numpy
        array = numpy.ascontiguousarray(value)
        if array.dtype.kind in "USVcmM":  # the loader reads bool, int, uint and float tensors
            raise TypeError(f"ringfeed: a {codec} field of dtype {array.dtype} would not be read: the loader takes bool, "
                            "int, uint and float arrays" + ("; give ('text', value) for text" if array.dtype.kind in "US"
                                                          else ""))
        if array.dtype.byteorder == ">":  # the same values, in the byte order the loader reads
            array = array.astype(array.dtype.newbyteorder("<"))
        buf = io.BytesIO()
        # No pickles: an array of Python objects would be stored as one, which no reader takes.
        numpy.save(buf, array, allow_pickle=False)
        return buf.getvalue()

    @staticmethod
    def _text(what, value):
        text = str(value).encode()
        if b"\0" in text:
            raise ValueError(f"ringfeed: {what} {value!r} holds a NUL character")
        return text

    def add(self, key, label=-1, fields=None):
        """Appends one record. FIELDS maps a name to (codec, bytes or array), or to bytes or an
        array alone (stored raw)."""
        if not self._handle:
            raise Error(-9, "the writer is closed")
        if fields is not None and not isinstance(fields, dict):
            raise TypeError(f"ringfeed: fields maps field names to values, not {type(fields).__name__}")
        parts = []  # every payload made before the record starts: a bad value leaves nothing open
        for name, value in (fields or {}).items():
            codec, data = value if isinstance(value, tuple) else ("raw", value)
            parts.append((self._text("field name", name), codec.encode(), self._payload(data, codec)))
        key = self._text("key", key)
        # A field the library refuses drops the record, so the next add() starts afresh.
        _check(lib.dl_writer_begin(self._handle, key, int(label)))
        for name, codec, data in parts:
            _check(lib.dl_writer_field(self._handle, name, codec, data, len(data)))
        _check(lib.dl_writer_end(self._handle))

    def close(self):
        if self._handle:
            handle, self._handle = self._handle, ctypes.c_void_p()
            _check(lib.dl_writer_close(handle))

    def abort(self):
        if self._handle:
            handle, self._handle = self._handle, ctypes.c_void_p()
            lib.dl_writer_abort(handle)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.abort()


# torch.utils.data.DataLoader's keywords that ringfeed spells otherwise or does not need: what
# to write instead, added to the unknown-option error of someone moving over.
_DATALOADER_HINTS = {
    "num_workers": "a DataLoader keyword: ringfeed's is workers=N, threads of the library",
    "prefetch_factor": "a DataLoader keyword: ringfeed's is prefetch=N, batches in flight in all",
    "pin_memory": "a DataLoader keyword: batches are always in pinned memory, and device='cuda' "
                  "puts them on the GPU",
    "persistent_workers": "a DataLoader keyword: the workers live as long as the Loader",
    "collate_fn": "a DataLoader keyword: batches come collated, a dict of tensors",
    "sampler": "a DataLoader keyword: order comes from shuffle=, seed=, rank= and world_size=",
    "batch_sampler": "a DataLoader keyword: order comes from shuffle=, seed=, rank= and world_size=",
    "generator": "a DataLoader keyword: the shuffle comes from seed=",
    "worker_init_fn": "a DataLoader keyword: the workers are the library's threads and run no Python",
    "timeout": "a DataLoader keyword: a batch is waited for until it comes, Ctrl-C interrupts",
    "transform": "crop, resize, flip and normalisation are options (crop=, image_size=, flip=, dtype=, mean=, "
                 "std=); for more, batch_transform=fn is called with each batch's dict of tensors (on the GPU "
                 "where the batch is: torchvision.transforms.v2 works there)",
    "target_transform": "labels come as a tensor in each batch: change them in batch_transform=fn",
}
# Keywords of the binding itself, not options of the library.
_BINDING_KEYWORDS = ("log_stats_every", "batch_transform")


def _token(state):
    """The resume token of STATE: state_dict()'s {"token": ...}, or the token itself."""
    token = state.get("token") if isinstance(state, dict) else state
    if not isinstance(token, str):
        raise ValueError(f"ringfeed: a state is what state_dict() returns ({{'token': 'rf2...'}}), not {state!r:.80}")
    return token


class Loader:
    """Batches of SOURCE: tar shards (a path, a list, globs, brace ranges), an ImageFolder, or a
    MosaicML Streaming (MDS) dataset's folder.
    Keywords are the C options (batch_size, workers, prefetch, image_size, crop, flip, channels,
    layout, seed, shuffle, epochs, start_epoch, drop_last, rank, world_size, device, dtype, mean,
    std, on_error, io, ...); rank and world_size default to torchrun's RANK and WORLD_SIZE, and
    device="cuda" to cuda:$LOCAL_RANK. state= resumes from a state_dict(). framework= picks
    "torch", "numpy" or "dlpack" (default: torch if importable, else numpy, else dlpack).

    Each `for batch in loader` yields one epoch (len(loader) batches), the next `for` the next
    epoch, while the workers prefetch across the boundary, without end as a DataLoader does;
    epochs=E ends the run after epoch E-1, and a `for` after that warns and yields nothing.
    set_epoch(e) makes the next `for` epoch e. next(loader) takes batches regardless of epochs. A Loader
    has its own workers: iterate it directly, not through torch.utils.data.DataLoader.
    log_stats_every=N writes the loader's verdict on what holds training back (stats()'s
    "bottleneck" and "bottleneck_why") to stderr every N batches."""

    def __init__(self, source, *, state=None, framework=None, **options):
        self._handle = ctypes.c_void_p()
        if not hasattr(self, "_guard"):  # kept when the loader reopens (set_epoch, load_state_dict)
            self._lock = threading.Lock()  # a Condition's own enter and exit cost more, on each batch
            self._guard = threading.Condition(self._lock)  # for close() to wait on
            self._users = 0
        self._framework = _framework(framework)
        self._torch = _needs("torch") if self._framework == "torch" else None
        self._batch_devices = {}  # device_index: where its batches live (see _batch_device)
        if self._framework == "numpy":
            self._numpy = _needs("numpy")
        if self._framework == "numpy" and _format("dtype", options.get("dtype", "uint8")).lower() == "bfloat16":
            raise ValueError("ringfeed: dtype=bfloat16 with framework='numpy': numpy has no bfloat16; use torch "
                             "(framework='torch'), or dtype float16 or float32")
        # A path as str, bytes or os.PathLike (pathlib), or a list, tuple or other iterable of them
        # (a generator, glob.iglob, Path.glob).
        if not isinstance(source, (str, bytes, os.PathLike)):
            try:
                parts = list(source)
            except TypeError:
                raise TypeError(f"ringfeed: the source is a path or an iterable of paths, not {type(source).__name__}") \
                    from None
            source = "::".join(os.fsdecode(s) for s in parts)
        source = os.fsdecode(source)
        if "rank" not in options and "RANK" in os.environ:
            options["rank"] = int(os.environ["RANK"])
        if "world_size" not in options and "WORLD_SIZE" in os.environ:
            options["world_size"] = int(os.environ["WORLD_SIZE"])
        if state is not None:
            options["resume"] = _token(state)
        self._options = dict(options)
        self._source = source
        # Epochs without end unless given, as a DataLoader has them: each `for` is one.
        self._epochs = options.get("epochs") or 0
        if "epochs" not in options or options["epochs"] is None:
            options["epochs"] = 0
        self._warned_done = getattr(self, "_warned_done", False)
        transform = options.get("batch_transform")
        if transform is not None and not callable(transform):
            raise TypeError(f"ringfeed: batch_transform={transform!r}: give a function of a batch (a dict) that "
                            "returns the batch to hand out")
        self._transform = transform
        for key, value in options.items():  # a keyword given as None is still a keyword: known or not
            if value is None and key not in _BINDING_KEYWORDS and not lib.dl_option_exists(key.encode()):
                message = (lib.dl_last_error() or b"").decode(errors="replace") or f"unknown option '{key}'"
                hint = _DATALOADER_HINTS.get(key)
                raise Error(_DL_EOPTION, message + (f" ({hint})" if hint else ""))
        every = options.get("log_stats_every") or 0
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"ringfeed: log_stats_every={every!r}: expected a number of batches (0: never)")
        self._log_every = every
        self._handed = 0
        text = " ".join(f"{k}={_format(k, v)}" for k, v in options.items()
                        if v is not None and k not in _BINDING_KEYWORDS)
        rc = lib.dl_open(ctypes.byref(self._handle), os.fsencode(source), os.fsencode(text))
        if rc < 0:
            message = (lib.dl_last_error() or b"").decode(errors="replace")
            hint = next((h for k, h in _DATALOADER_HINTS.items() if f"unknown option '{k}'" in message), None)
            raise Error(rc, f"{message} ({hint})" if hint else message)
        # The epoch the next batch belongs to (the token names where the run starts), and the
        # next batch's index within it: past those handed out before a resumed state was saved.
        self._epoch = int(self.state_dict()["token"].split(".")[2])
        self._layout = None  # the batches' field names, read of the first batch
        with self._use() as handle:
            self._per_epoch = lib.dl_batches_per_epoch(handle)
            self._next_index = self._per_epoch - lib.dl_epoch_batches(handle, self._epoch)
            names = []
            while (name := lib.dl_class_name(handle, len(names))) is not None:
                names.append(os.fsdecode(name))
        self._classes = names or None
        self._device = str(options.get("device", "cpu"))


    # -- iteration -------------------------------------------------------------------------

    def __iter__(self) -> "Iterator[dict]":
        """One epoch: the batches up to the end of the epoch the next batch belongs to."""
        first = True
        while True:
            batch = self.next_batch()
            if batch is None:
                if first:
                    self._say_done()
                return
            first = False
            last = self._next_index == 0  # the batch ended its epoch
            # Handed on without a name here: a suspended generator that still named it would hold
            # its slot while the loop takes the next one, whatever the loop does with its own.
            handed = [batch]
            del batch
            yield handed.pop()
            if last:
                return

    def __next__(self) -> dict:
        batch = self.next_batch()
        if batch is None:
            raise StopIteration
        return batch

    @property
    def classes(self):
        """An ImageFolder's class names, sorted, each label indexing them (torchvision's
        ImageFolder.classes: len(loader.classes) is the model's number of classes); None for a
        source whose labels no folder names (shards)."""
        return self._classes

    @property
    def class_to_idx(self):
        """{class name: label} of an ImageFolder, as torchvision's; None where `classes` is."""
        return None if self._classes is None else {name: i for i, name in enumerate(self._classes)}

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Makes the next batches those of EPOCH, from its start (DistributedSampler.set_epoch's
        habit: calling it with the epoch that comes next anyway changes nothing; the epoch under way,
        left by a `break`, starts again)."""
        epoch = int(epoch)
        if epoch < 0:
            raise ValueError(f"ringfeed: set_epoch({epoch}): epochs count from 0")
        if self._epochs and epoch >= self._epochs:
            raise ValueError(f"ringfeed: set_epoch({epoch}): the loader was opened with epochs={self._epochs}, so its "
                             f"last epoch is {self._epochs - 1}; leave epochs out (epochs without end, the default) "
                             f"or give epochs={epoch + 1} or more")
        if epoch == self._epoch and self._at_epoch_start():
            return
        self._live()
        self.close()
        options = {k: v for k, v in self._options.items() if k not in ("resume", "start_epoch")}
        self.__init__(self._source, framework=self._framework, start_epoch=epoch, **options)

    def _say_done(self):
        """A `for` over a run that has ended: said once, with what to do, rather than nothing."""
        if self._warned_done:
            return
        self._warned_done = True
        warnings.warn(f"ringfeed: the run has ended (epochs={self._epochs}: epochs 0 to {self._epochs - 1} were "
                      "delivered), so this for loop yields nothing; leave epochs out for epochs without end, "
                      "or give a larger epochs=", RuntimeWarning, stacklevel=3)

    def _at_epoch_start(self):
        """Whether the next batch is the first of its epoch (the token's position is 0)."""
        return self.state_dict()["token"].split(".")[3] == "0"

    def __getitem__(self, index):
        raise TypeError("ringfeed.Loader is a loader with its own workers, not a dataset: iterate it "
                        "directly (for batch in loader) instead of wrapping it in torch.utils.data.DataLoader")

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self._options.items() if k != "resume")
        state = "closed" if not self._handle else f"epoch {self._epoch}"
        source = _CREDENTIALS.sub(r"\1", self._source)
        return f"ringfeed.Loader({source!r}{options}, framework={self._framework!r}) <{state}>"

    def _enter(self, closed, entered):
        """The C handle, counted in use until _leave: close() from another thread waits until every
        use has ended before dl_close frees the loader, so no call is made on a freed one. ENTERED[0]
        is set with the count, no call between them, so that an interrupt anywhere after still has
        the count undone. A closed loader raises CLOSED (code, message) instead of handing C a NULL."""
        with self._lock:
            if not self._handle:
                raise Error(*closed)
            self._users += 1
            entered[0] = True
            return self._handle

    def _leave(self):
        with self._lock:
            self._users -= 1
            if not self._users and not self._handle:  # a close() waits for the last use
                self._guard.notify_all()

    @contextlib.contextmanager
    def _use(self, closed=(-9, "the loader is closed")):
        """_enter and _leave around a block. next_batch makes the two calls itself: with the loader
        ahead, a generator's context cost it about 50 us a batch on a 2-CPU host (its median 0.29 ms
        against 0.24, bench/python_batch_cost.py)."""
        entered = [False]
        try:
            yield self._enter(closed, entered)
        finally:
            if entered[0]:
                self._leave()

    def _live(self):
        with self._use() as handle:
            return handle

    def next_batch(self, device_index=0):
        """The next batch as a dict, or None at the end of the last epoch."""
        b = ctypes.c_void_p()
        # Short waits: between them Python runs its signal handlers, so Ctrl-C interrupts a
        # wait for a slow batch at once instead of after it; and close() from another thread
        # takes effect between two of them.
        closed = (-9, "the loader is closed")
        while True:
            entered = [False]
            try:
                handle = self._enter(closed, entered)
                rc = lib.dl_next_batch_timed(handle, device_index, _WAIT_SLICE_MS, ctypes.byref(b))
                if rc == 0:
                    return self._take(handle, b, device_index)
            finally:
                if entered[0]:
                    self._leave()
            if rc != _ETIMEDOUT:
                break
            closed = (_DL_ECLOSED, "the loader was closed while waiting for a batch")
        if rc == _DL_EBUSY:
            one = str(self._options.get("prefetch")) == "1"
            raise Error(rc, (lib.dl_last_error() or b"").decode() + "; batches are zero-copy views "
                        "of the loader's slots: drop earlier batches, or keep copies (.clone(), .copy())" +
                        ("; a for loop's variable still names the last batch while the next is taken, so "
                         "with prefetch=1 end the loop's body with `del batch`, or give prefetch=2 or more"
                         if one else ""))
        _check(rc)
        return None  # DL_EOF

    def _take(self, handle, b, device_index):
        """Batch B as a dict of tensors, then the loader-side hold released."""
        stream = None
        try:
            device = self._batch_device(b, device_index)
            stream = self._consumer_stream(device)
            if stream is not None:
                _check(lib.dl_batch_wait(b, stream))
            n = lib.dl_batch_size(b)
            tensors, members = self._layout or self._read_layout(b)
            out = {}
            for key, name in tensors:
                labels = name == b"label" and device  # torch's, copied out; numpy's in _export
                out[key] = self._labels(b, n, device, stream) if labels else self._export(b, name)
            if members:
                size = ctypes.c_size_t()
                for key, name, kind in members:
                    out[key] = [_member(kind, lib.dl_batch_bytes(b, name, i, ctypes.byref(size)), size.value)
                                for i in range(n)]
            out["key"] = self._keys(b) if n else []
            epoch, index = ctypes.c_int64(), ctypes.c_int64()
            lib.dl_batch_position(b, ctypes.byref(epoch), ctypes.byref(index))
            out["epoch"], out["index"] = epoch.value, index.value
            last = index.value == self._per_epoch - 1
            self._epoch = epoch.value + 1 if last else epoch.value
            self._next_index = 0 if last else index.value + 1
            if lib.dl_batch_errors(b):  # one call a batch: B calls cost the training loop's thread
                out["error"] = [lib.dl_batch_sample_error(b, i) for i in range(n)]
        finally:
            # The tensors hold the batch; releasing here only ends the loader-side hold. On CUDA
            # the release is recorded on the consumer's stream, so queued work still sees the data.
            lib.dl_batch_release(b, stream)
        self._handed += 1  # after the release: a failure to log cannot keep the batch's slot
        if self._log_every and self._handed % self._log_every == 0:
            self._log_stats()
        if self._transform is not None:
            changed = self._transform(out)
            out = out if changed is None else changed
        return out

    def _keys(self, b):
        """The batch's keys as str, as _name decodes each: one C call joins them into one string and
        one decode splits it (keys hold no NUL, which no UTF-8 sequence or escaped byte spans), where
        B bytes objects, one a key, cost more (bench/python_batch_cost.py)."""
        size = ctypes.c_size_t()
        text = lib.dl_batch_keys_text(b, ctypes.byref(size))
        if not text:
            _check(_EINVAL)  # raises, with the library's message
        return ctypes.string_at(text, size.value - 1).decode("utf-8", "surrogateescape").split("\0")

    def _read_layout(self, b):
        """The names of the batch's tensors and members (with what each member holds): the same in
        every batch of a loader, so read of its first batch only."""
        tensors = [lib.dl_batch_field_name(b, i) for i in range(lib.dl_batch_field_count(b))]
        members = [(lib.dl_batch_bytes_name(b, k), lib.dl_batch_bytes_kind(b, k))
                   for k in range(lib.dl_batch_bytes_count(b))]
        self._layout = [(_name(n), n) for n in tensors], [(_name(n), n, kind) for n, kind in members]
        return self._layout

    def _batch_device(self, b, device_index):
        """Where the batches of DEVICE_INDEX live, for torch: (DLPack device type, id, torch.device),
        asked of the first batch (an index's batches stay on one device); None for other frameworks."""
        if self._torch is None:
            return None
        device = self._batch_devices.get(device_index)
        if device is None:
            from ._lib import DLTensor
            desc = DLTensor()
            _check(lib.dl_batch_field(b, b"label", ctypes.byref(desc)))
            kind, number = desc.device.device_type, desc.device.device_id
            where = self._torch.device("cuda", number) if kind == K_DL_CUDA else self._torch.device("cpu")
            device = self._batch_devices[device_index] = (kind, number, where)
        return device

    def _consumer_stream(self, device):
        """The handle of torch's current stream on DEVICE, which waits for the batch and on which it is
        released; None for host batches. After torch's public call has set CUDA up, the handle alone:
        a Stream object each batch cost the loop's thread 41-56 us against 6 on an H100 host
        (bench/python_batch_cost.py --parts)."""
        global _raw_stream
        if device is None or device[0] != K_DL_CUDA:
            return None
        if _raw_stream is not None:
            return _raw_stream(device[1])
        handle = self._torch.cuda.current_stream(device[1]).cuda_stream
        _raw_stream = getattr(self._torch._C, "_cuda_getCurrentRawStream", None)
        return handle

    def _labels(self, b, n, device, stream):
        """The labels as a torch tensor of their own (B integers: a loop that keeps them for its
        metrics, as DataLoader allows, then holds no slot), which the library fills (on a GPU, on the
        consumer's stream) without the export, DLPack import and clone a view of them would take."""
        labels = self._torch.empty(n, dtype=self._torch.int64, device=device[2])
        _check(lib.dl_batch_copy(b, b"label", labels.data_ptr(), 8 * n, stream))
        return labels

    def _export(self, b, field):
        """Field FIELD of batch B: a view of its slot; numpy's labels a copy (torch's: _labels)."""
        managed = ctypes.POINTER(DLManagedTensor)()
        _check(lib.dl_batch_export(b, field, ctypes.byref(managed)))
        if self._framework == "torch":  # the capsule straight to torch, which needs no wrapper
            return self._torch.utils.dlpack.from_dlpack(_dlpack.capsule(managed))
        tensor = _dlpack.DLPackTensor(managed)
        if self._framework == "numpy":
            view = self._numpy.from_dlpack(tensor)
            return view.copy() if field == b"label" else view
        return tensor

    # -- state, stats, lifetime --------------------------------------------------------------

    def __len__(self):
        """The batches the next `for` yields: those left in the epoch under way (all of an epoch
        that has not begun, fewer after a resume part-way, 0 once a run of epochs=E has ended)."""
        with self._use() as handle:
            if not lib.dl_epoch_batches(handle, self._epoch):
                return 0
            return int(lib.dl_batches_per_epoch(handle)) - self._next_index

    def state_dict(self):
        """Where the stream stands: pass it back as Loader(..., state=...) to continue after the
        last batch handed out (also at another world size)."""
        buf = ctypes.create_string_buffer(512)
        with self._use() as handle:
            _check(lib.dl_state_save(handle, buf, len(buf)))
        return {"token": buf.value.decode()}

    def load_state_dict(self, state):
        """Reopens the loader at STATE (as returned by state_dict()). A state the loader refuses
        (another dataset's, a damaged token) raises, and the loader goes on where it was."""
        token = _token(state)
        here = self.state_dict()["token"]
        options = {k: v for k, v in self._options.items() if k != "resume"}
        self.close()
        try:
            self.__init__(self._source, state=token, framework=self._framework, **options)
        except Error:
            self.__init__(self._source, state=here, framework=self._framework, **options)
            raise

    def __reduce__(self):
        raise TypeError("a ringfeed.Loader cannot be pickled or copied: it owns worker threads and pinned "
                        "memory. Open one in each process (rank= and world_size= split the data; torchrun's "
                        "RANK and WORLD_SIZE are read), and pass state_dict() to resume")

    def _log_stats(self):
        s = self.stats()
        sys.stderr.write(f"ringfeed: after {self._handed} batches: bottleneck {s['bottleneck']} "
                         f"({s['bottleneck_why']})\n")

    def stats(self):
        """The loader's counters since it opened, as a dict; "bottleneck" says in one word what holds
        the consumer back (consumer: nothing, the loader keeps up; else decode, read or copy) and
        "bottleneck_why" the figures that show it."""
        buf = ctypes.create_string_buffer(8192)
        with self._use() as handle:
            _check(lib.dl_stats_json(handle, buf, len(buf)))
        return json.loads(buf.value.decode())

    def close(self):
        """Stops the workers and frees the loader (tensors handed out stay valid). From another
        thread it ends a wait for a batch there (DL_ECLOSED) within a wait slice."""
        with self._guard:
            handle, self._handle = self._handle, ctypes.c_void_p()
            if not handle:
                return
            while self._users:  # a call in flight on another thread: each ends within a slice
                self._guard.wait()
        lib.dl_close(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) and hasattr(self, "_guard"):
            self.close()
