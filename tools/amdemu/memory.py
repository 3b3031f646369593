"""Host memory that stands in for device memory: one arena, allocations with guard gaps
between them, and vectorized, bounds-checked gathers and scatters.  Any access that does
not fall entirely inside one live allocation raises MemoryFault (a real GPU would read or
write someone else's memory, or fault)."""

import numpy as np


class EmuError(Exception):
    """Base of every error the emulator reports about the code it runs."""


class MemoryFault(EmuError):
    pass


class Memory:
    BASE = 0x7F10_0000_0000  # above 4 GB: 32-bit truncation of an address faults
    ALIGN = 256
    GUARD = 4096

    def __init__(self, capacity=1 << 20):
        self.arena = np.zeros(capacity, np.uint8)
        self.top = self.GUARD
        self.starts, self.ends, self.names = [], [], []
        self._st = self._en = None

    def alloc(self, nbytes, name="", data=None):
        """Address of nbytes of fresh memory (filled with 0xA5 bytes unless data is given)."""
        nbytes = max(int(nbytes), 1)
        start = (self.top + self.ALIGN - 1) // self.ALIGN * self.ALIGN
        end = start + nbytes
        while end + self.GUARD > self.arena.size:
            self.arena = np.concatenate([self.arena, np.zeros(self.arena.size, np.uint8)])
        self.arena[start:end] = 0xA5
        self.top = end + self.GUARD
        self.starts.append(start)
        self.ends.append(end)
        self.names.append(name)
        self._st = self._en = None
        addr = self.BASE + start
        if data is not None:
            self.write(addr, data)
        return addr

    def array(self, a, name=""):
        """Copies numpy array a into a new allocation; returns its address."""
        a = np.ascontiguousarray(a)
        return self.alloc(a.nbytes, name, a.view(np.uint8).reshape(-1))

    def write(self, addr, data):
        b = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        o = self._check_range(addr, b.size)
        self.arena[o:o + b.size] = b

    def read(self, addr, nbytes, dtype=np.uint8, shape=None):
        o = self._check_range(addr, nbytes)
        a = self.arena[o:o + nbytes].copy().view(dtype)
        return a.reshape(shape) if shape is not None else a

    def _check_range(self, addr, n):
        o = int(addr) - self.BASE
        for s, e in zip(self.starts, self.ends):
            if s <= o and o + n <= e:
                return o
        raise MemoryFault(f"host access [{addr:#x}, +{n}) outside every allocation")

    def _tables(self):
        if self._st is None:
            self._st = np.array(self.starts, np.int64)
            self._en = np.array(self.ends, np.int64)
        return self._st, self._en

    def offsets(self, addrs, width, what):
        """Arena offsets of accesses of `width` bytes at addrs (uint64 array); MemoryFault
        unless each lies entirely inside one allocation."""
        o = addrs.astype(np.int64) - self.BASE
        st, en = self._tables()
        idx = np.searchsorted(st, o, side="right") - 1
        ok = (idx >= 0) & (o + width <= en[np.maximum(idx, 0)]) & (o >= st[np.maximum(idx, 0)])
        if not ok.all():
            bad = int(addrs[~ok][0])
            raise MemoryFault(f"{what}: {width}-byte access at {bad:#x} is outside every allocation "
                              f"({self.describe(bad)})")
        return o

    def describe(self, addr):
        o = addr - self.BASE
        best = None
        for s, e, n in zip(self.starts, self.ends, self.names):
            d = 0 if s <= o < e else min(abs(o - s), abs(o - e))
            if best is None or d < best[0]:
                best = (d, f"nearest allocation {n!r} [{self.BASE + s:#x}, {self.BASE + e:#x})")
        return best[1] if best else "no allocations"

    def gather(self, addrs, width, what="load"):
        """(n, width) uint8 of the bytes at each address."""
        o = self.offsets(addrs, width, what)
        return self.arena[o[:, None] + np.arange(width)]

    def scatter(self, addrs, data, what="store"):
        width = data.shape[1]
        o = self.offsets(addrs, width, what)
        self.arena[(o[:, None] + np.arange(width)).reshape(-1)] = data.reshape(-1)
