"""Weights through shared memory on one node: the staging file, and the learner's shelf for same-node generators.

`WeightStaging` is one file in /dev/shm (else the temp folder), unlinked as soon as it exists and reached by
other processes of the same user through /proc/<pid>/fd/<fd>, so no exit leaves it behind; its pages are
touched once and reused by every version. A generator stages each version there for its vLLM engine.

`Shelf` is the learner's end of the same-node path (core.weights.publisher, `shm=True`). Over TCP a version costs
the learner's send, the kernel's copies and the generator's staging copy; through the shelf it costs one copy,
into a slot the engine reads directly.

What must hold:
- A subscriber is served by the shelf only once it proved it reads the learner's memory: after its hello the
  publisher names a probe file (under the run's keys), and the subscriber answers with the 32 random bytes it
  holds. A subscriber in another node, container or user cannot, and keeps receiving chunks over TCP.
- A slot is written only when every subscriber it was offered to has acked that version or a later one (or
  is gone or was skipped): a version being loaded is never overwritten. With no slot free the version goes over
  TCP, so a stuck generator never holds the learner.
- What a subscriber maps is checked before use: every tensor's name (against the checkpoint when known),
  dtype, shape, and its byte range inside the file. A mapped version is valid until the subscriber acks it.
"""
from __future__ import annotations

import hmac
import math
import mmap
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable

from core.trajectory import WireError
from core.weights.control import unpack_map
from core.weights.tensors import TensorBytes, WeightSet, byte_view, itemsize

ALIGN = 64
TOKEN_BYTES = 32
MAX_TENSORS = 1 << 16


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def staged_nbytes(tensors: dict[str, tuple[str, tuple[int, ...]]], itemsize: int = 4) -> int:
    """Staging bytes for a weight set of these tensors sent with `itemsize`-byte elements (aligned)."""
    return sum(_aligned(itemsize * math.prod(shape)) for _, shape in tensors.values())


def default_staging_dir(nbytes: int) -> Path:
    """/dev/shm when it exists and has room for `nbytes` (with a margin), else the system temp folder."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 * nbytes:
        return shm
    return Path(tempfile.gettempdir())


class WeightStaging:
    """One shared-memory file, written once per version: the generator's staging file, or one slot of the
    learner's `Shelf`."""

    def __init__(self, directory: str = "", name: str = "generator"):
        self.directory = directory
        self.name = name
        self.path: Path | None = None
        self._file = None
        self._map: mmap.mmap | None = None
        self._unlink = False

    def reserve(self, nbytes: int) -> None:
        """Create the file now and touch every page, so the first version is copied at memcpy speed."""
        self._ensure(nbytes)
        assert self._map is not None
        block = bytes(1 << 20)
        for off in range(0, len(self._map), len(block)):
            n = min(len(block), len(self._map) - off)
            self._map[off:off + n] = block[:n]

    def write(self, tensors: list[TensorBytes]) -> tuple[str, list[tuple[str, str, list[int], int, int]]]:
        """Copy `tensors` into the staging file; returns (path, index) for `agentgym_load_weights`."""
        index, offset = [], 0
        for t in tensors:
            n = byte_view(t.data).nbytes
            index.append((t.name, t.dtype, list(t.shape), offset, n))
            offset += _aligned(n)
        self._ensure(max(offset, ALIGN))
        assert self._map is not None
        for t, (_, _, _, off, n) in zip(tensors, index):
            self._map[off:off + n] = byte_view(t.data)
        return str(self.path), index

    def _ensure(self, size: int) -> None:
        size = _aligned(size)
        if self._map is not None and len(self._map) >= size:
            return
        self.close()
        directory = Path(self.directory) if self.directory else default_staging_dir(size)
        directory.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=f"agentgym-weights-{self.name}-", dir=directory)
        os.ftruncate(fd, size)
        self._file = os.fdopen(fd, "r+b")
        self._map = mmap.mmap(self._file.fileno(), size)
        proc_path = Path(f"/proc/{os.getpid()}/fd/{fd}")
        if proc_path.exists():
            # Unlinked at once and reached through /proc by the engine (same machine, same user): the memory
            # goes back when this process ends, however it ends (a killed actor leaves nothing in /dev/shm).
            os.unlink(path)
            self.path, self._unlink = proc_path, False
        else:
            self.path, self._unlink = Path(path), True

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None and self._unlink:
            self.path.unlink(missing_ok=True)
        self.path = None


class Shelf:
    """The publisher's slots and its probe file."""

    def __init__(self, slots: int = 2, directory: str = ""):
        self.token = os.urandom(TOKEN_BYTES)
        self._probe = WeightStaging(directory, "probe")
        self._probe.write([TensorBytes("token", "uint8", (TOKEN_BYTES,), self.token)])
        self._slots = [WeightStaging(directory, f"shelf{i}") for i in range(slots)]
        self.held: list[tuple[int, frozenset[str]]] = [(-1, frozenset())] * slots  # version, offered to

    def offer(self) -> dict:
        return {"path": str(self._probe.path)}

    def admits(self, token: str) -> bool:
        """Whether `token` (hex) is the probe's."""
        return hmac.compare_digest(token.encode("ascii", "replace"), self.token.hex().encode())

    def put(self, version: int, tensors: list[TensorBytes], names: frozenset[str],
            released: Callable[[int, frozenset[str]], bool]) -> tuple[str, list] | None:
        """Write `version` into a free slot for `names`; (path, index), or None when no slot is free.
        `released(version, names)` says whether a slot's readers are all done with it."""
        for i, (held, readers) in enumerate(self.held):
            if held < 0 or released(held, readers):
                self.held[i] = (-1, frozenset())
                path, index = self._slots[i].write(tensors)
                self.held[i] = (version, names)
                return path, index
        return None

    def close(self) -> None:
        for staging in [self._probe, *self._slots]:
            staging.close()


def _open_regular(path: str) -> int:
    """A read-only descriptor of the regular file at `path` (never blocks on a pipe or device); OSError or
    ValueError (a NUL in the path) otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


def read_probe(path: str) -> bytes:
    """The token at the head of a publisher's probe file; empty when this process cannot read it."""
    try:
        fd = _open_regular(path)
    except (OSError, ValueError):
        return b""
    try:
        return os.pread(fd, TOKEN_BYTES, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)


def unpack_shelved(buf) -> dict:
    """The msgpack map of a shelved version's announcement (an index entry per tensor); WireError if malformed."""
    return unpack_map(buf, max_array_len=MAX_TENSORS)


def parse_shelved(body: dict, expected: dict[str, tuple[int, ...]] | None, max_total_bytes: int) -> WeightSet:
    """A shelved version's announcement {"version", "path", "index"} -> a WeightSet of read-only views of the
    file, with `shelf` = (path, index); WireError naming what is wrong."""
    version, path, index = body.get("version"), body.get("path"), body.get("index")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise WireError("version", "expected a non-negative int")
    if not isinstance(path, str) or not path.startswith(("/proc/", "/dev/shm/", tempfile.gettempdir())):
        raise WireError("path", f"not a shared-memory file: {path!r:.80}")
    if not isinstance(index, list) or not 0 < len(index) <= MAX_TENSORS:
        raise WireError("index", "expected a list of tensors")
    try:
        fd = _open_regular(path)
        try:
            size = os.fstat(fd).st_size
            whole = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:
        raise WireError("path", f"cannot map {path!r:.80}: {exc}") from None
    if whole is None:
        raise WireError("path", "empty file")
    view, tensors, total = memoryview(whole), {}, 0
    for entry in index:
        if not (isinstance(entry, list) and len(entry) == 5):
            raise WireError("index", "expected [name, dtype, shape, offset, nbytes]")
        name, dtype, shape, offset, nbytes = entry
        if not isinstance(name, str) or not 0 < len(name) <= 512 or name in tensors:
            raise WireError("index", f"bad or repeated tensor name {name!r:.80}")
        if not (isinstance(shape, list) and len(shape) <= 8 and all(isinstance(d, int) and 0 <= d < 1 << 40
                                                                     for d in shape)):
            raise WireError("shape", f"{name}: bad shape")
        if expected is not None and tuple(shape) != expected.get(name, ()):
            raise WireError("shape", f"{name}: {shape} is not the checkpoint's {expected.get(name)}")
        n = math.prod(shape) * itemsize(dtype)
        if not (isinstance(offset, int) and isinstance(nbytes, int) and nbytes == n and 0 <= offset
                and offset + n <= size):
            raise WireError("offset", f"{name}: bytes [{offset}, +{nbytes}) are not {n} bytes inside the file")
        total += n
        tensors[name] = TensorBytes(name, dtype, tuple(shape), view[offset:offset + n])
    if max_total_bytes and total > max_total_bytes:
        raise WireError("index", f"{total} bytes, more than the {max_total_bytes} a version may hold")
    return WeightSet(version, tensors, shelf=(path, [list(e) for e in index]))
