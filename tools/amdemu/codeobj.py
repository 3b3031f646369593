"""Loads an AMDGPU code object (the ELF that clang-19 links for gfx90a / gfx942): its
kernels' descriptors (`<kernel>.kd`, 64 bytes) and their instructions, decoded by LLVM's
own disassembler (llvm-objdump-19 --mcpu=<arch>), which knows both architectures'
encodings (gfx90a and gfx942 give the bf16 MFMAs different opcodes)."""

import re
import struct
import subprocess

from . import build


class KernelDescriptor:
    """The fields of the amdhsa kernel descriptor the launcher needs."""

    def __init__(self, raw):
        assert len(raw) == 64
        self.group_segment_size, self.private_segment_size, self.kernarg_size = struct.unpack_from("<III", raw, 0)
        (self.entry_offset,) = struct.unpack_from("<q", raw, 16)
        self.rsrc3, self.rsrc1, self.rsrc2 = struct.unpack_from("<III", raw, 44)
        (self.code_props,) = struct.unpack_from("<H", raw, 56)
        # kernel_code_properties: which user SGPRs arrive, in this order.
        p = self.code_props
        self.user_sgprs = [name for bit, name in ((0, "private_segment_buffer"), (1, "dispatch_ptr"),
                                                  (2, "queue_ptr"), (3, "kernarg_segment_ptr"), (4, "dispatch_id"),
                                                  (5, "flat_scratch_init"), (6, "private_segment_size"))
                           if p >> bit & 1]
        self.wave32 = bool(p >> 10 & 1)
        r2 = self.rsrc2
        self.private_segment_wave_offset = bool(r2 & 1)
        self.user_sgpr_count = (r2 >> 1) & 0x1F
        self.workgroup_id = [bool(r2 >> 7 & 1), bool(r2 >> 8 & 1), bool(r2 >> 9 & 1)]
        self.workgroup_info = bool(r2 >> 10 & 1)
        self.workitem_id_vgprs = (r2 >> 11) & 3  # 0: x, 1: x and y, 2: x, y, z
        self.accum_offset = ((self.rsrc3 & 0x3F) + 1) * 4  # first AGPR in the unified file (gfx90a+)


class Instr:
    __slots__ = ("addr", "size", "mnem", "ops", "mods", "text", "fn")

    def __init__(self, addr, size, mnem, ops, mods, text):
        self.addr, self.size, self.mnem, self.ops, self.mods, self.text = addr, size, mnem, ops, mods, text
        self.fn = None

    def __repr__(self):
        return f"{self.addr:#x}: {self.text}"


LINE = re.compile(r"^\t([a-z_0-9]+)(?: +(.*?))?\s*// ([0-9A-F]+): ([0-9A-F ]+?)(?:\s+<.*)?$")


def split_operands(s):
    """'v1, s[0:3], 0 offen offset:16' -> (['v1', 's[0:3]', '0'], {'offen': True, 'offset': '16'})."""
    if not s:
        return [], {}
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    # Modifiers follow the last operand, separated by spaces.
    last = parts[-1].split()
    parts[-1] = last[0]
    tail = last[1:]
    mods = {}
    for m in tail:
        if ":" in m:
            k, v = m.split(":", 1)
            mods[k] = v
        else:
            mods[m] = True
    return parts, mods


class CodeObject:
    def __init__(self, path, arch):
        self.path, self.arch = str(path), arch
        with open(path, "rb") as f:
            self.data = f.read()
        self._parse_elf()
        self._disassemble()

    def _parse_elf(self):
        d = self.data
        assert d[:4] == b"\x7fELF" and d[4] == 2, "not an ELF64 file"
        (e_shoff,) = struct.unpack_from("<Q", d, 0x28)
        e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", d, 0x3A)
        secs = []
        for i in range(e_shnum):
            name, typ, flags, addr, off, size, link, info, align, entsize = struct.unpack_from(
                "<IIQQQQIIQQ", d, e_shoff + i * e_shentsize)
            secs.append(dict(name=name, type=typ, addr=addr, off=off, size=size, link=link, entsize=entsize))
        shstr = secs[e_shstrndx]
        for s in secs:
            s["name"] = d[shstr["off"] + s["name"]:d.find(b"\0", shstr["off"] + s["name"])].decode()
        self.sections = secs
        self.symbols = {}
        for s in secs:
            if s["type"] not in (2, 11):  # SYMTAB, DYNSYM
                continue
            strtab = secs[s["link"]]
            for j in range(s["size"] // 24):
                st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from(
                    "<IBBHQQ", d, s["off"] + 24 * j)
                nm = d[strtab["off"] + st_name:d.find(b"\0", strtab["off"] + st_name)].decode()
                if nm:
                    self.symbols[nm] = (st_value, st_size, st_shndx)
        self.kernels = {}
        for nm, (val, size, shndx) in self.symbols.items():
            if nm.endswith(".kd"):
                self.kernels[nm[:-3]] = (val, KernelDescriptor(self.read_vaddr(val, 64)))

    def read_vaddr(self, vaddr, n):
        for s in self.sections:
            if s["type"] != 8 and s["addr"] <= vaddr < s["addr"] + s["size"] and s["addr"] != 0:
                o = s["off"] + vaddr - s["addr"]
                return self.data[o:o + n]
        raise KeyError(f"address {vaddr:#x} is in no section")

    def _disassemble(self):
        tool = build.objdump()
        if tool is None:
            raise RuntimeError("amdemu: llvm-objdump-19 not found (apt-get install llvm-19)")
        r = subprocess.run([tool, "-d", f"--mcpu={self.arch}", self.path], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        self.instrs = {}
        for line in r.stdout.splitlines():
            m = LINE.match(line)
            if not m:
                if line.startswith("\t") and "//" in line and not line.strip().startswith("//"):
                    raise RuntimeError(f"amdemu: cannot parse disassembly line: {line!r}")
                continue
            mnem, opstr, addr, words = m.groups()
            if mnem == "s_waitcnt":
                ops, mods = [], dict(re.findall(r"(\w+)\((\d+)\)", opstr or ""))
            else:
                ops, mods = split_operands(opstr or "")
            addr = int(addr, 16)
            self.instrs[addr] = Instr(addr, 4 * len(words.split()), mnem, ops, mods,
                                      (mnem + " " + (opstr or "")).strip())

    def patched(self, edit):
        """A copy whose instructions went through edit(instr) -> None (edit in place):
        the deliberately broken variants of the tests (a barrier removed, an offset
        changed) without touching the shared original."""
        import copy
        new = copy.copy(self)
        new.instrs = {}
        for a, ins in self.instrs.items():
            n = Instr(ins.addr, ins.size, ins.mnem, list(ins.ops), dict(ins.mods), ins.text)
            edit(n)
            new.instrs[a] = n
        return new

    def kernel(self, name_part):
        """(name, entry address, descriptor) of the one kernel whose name contains name_part."""
        hits = [k for k in self.kernels if name_part in k]
        if len(hits) != 1:
            raise KeyError(f"{len(hits)} kernels match {name_part!r}: {sorted(self.kernels)}")
        kd_addr, kd = self.kernels[hits[0]]
        return hits[0], kd_addr + kd.entry_offset, kd
