#!/usr/bin/env python3
"""Runs the AVX-512 tier's kernels on an emulated AVX-512 CPU (Bochs's CPU model of a Sapphire Rapids
Xeon, through the PyPI package bochscpu-python) and has tests/emu/avx512_emu.cc check the results.

usage: avx512_emu.py HARNESS

HARNESS (the lathe_avx512_emu binary) builds its cases natively, prints where its entry point, TLS,
emulator stack and output buffers are, and waits. This script maps HARNESS's whole address space into
the emulator (pages read from /proc/PID/mem when the emulated CPU first touches them), calls
LatheEmuRunCase(i) for every case on the emulated CPU, copies each case's outputs back into HARNESS
and lets it check them. Exit status: HARNESS's (0 = every case passed), 1 on an emulation fault.
"""
import ctypes
import glob
import json
import os
import struct
import subprocess
import sys
import time

import bochscpu
import bochscpu.cpu
import bochscpu.memory
import bochscpu.utils

PAGE = 4096
PML4 = 0x10_0000            # page-table pages go here, below the data pages
PA_BASE = 0x100_0000
SENTINEL = 0xDEAD_0000      # return address: fetching it (unmapped) ends a call
# Bochs's CPU models in the order of its cpudb; bochscpu's default model has AVX-512 without VNNI,
# which this tier needs (vpdpbusd). Index 30 is sapphire_rapids; verified through CPUID below.
MODEL_INDEX = 30


def select_cpu_model(index):
    lib = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(bochscpu.__file__), "_bochscpu*.so"))[0])
    sim = ctypes.c_void_p.in_dll(lib, "SIM")
    get = lib._ZN13bx_real_sim_c14get_param_enumEPKcP10bx_param_c
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    param = get(sim, b"cpu.model", None)
    if not param:
        sys.exit("avx512_emu.py: bochscpu has no cpu.model parameter")
    set_ = lib._ZN15bx_param_enum_c3setEl
    set_.restype, set_.argtypes = None, [ctypes.c_void_p, ctypes.c_long]
    set_(param, index)


def main():
    harness = sys.argv[1]
    select_cpu_model(MODEL_INDEX)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # the shim is for this process
    proc = subprocess.Popen([harness], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if not line:
        sys.exit("avx512_emu.py: %s exited before printing its cases (status %s)" % (harness, proc.wait()))
    meta = json.loads(line)
    mem = open("/proc/%d/mem" % proc.pid, "r+b", buffering=0)

    # Every readable mapping of the harness, page by page, at the same virtual addresses.
    pt = bochscpu.memory.PageMapLevel4Table()
    pa_to_va, va_to_pa = {}, {}
    pa = PA_BASE
    with open("/proc/%d/maps" % proc.pid) as f:
        for row in f:
            parts = row.split()
            lo, hi = (int(v, 16) for v in parts[0].split("-"))
            name = parts[5] if len(parts) > 5 else ""
            if parts[1][0] != "r" or name in ("[vvar]", "[vsyscall]"):
                continue
            for va in range(lo, hi, PAGE):
                pt.insert(va, pa, 1)
                pa_to_va[pa] = va
                va_to_pa[va] = pa
                pa += PAGE
    # A page for the CPUID probe, and the sentinel stays unmapped.
    probe_va, probe_pa = 0x7000_0000, pa
    pt.insert(probe_va, probe_pa, 1)
    for hva, gpa in pt.commit(PML4):
        bochscpu.memory.page_insert(gpa, hva)
    probe_hva = bochscpu.memory.allocate_host_page()
    bochscpu.memory.page_insert(probe_pa, probe_hva)

    # An exception must not escape into the emulator (it aborts): a page that cannot be read is
    # reported and mapped as zeros.
    loaded = set()

    def missing_page(gpa):
        page = gpa & ~(PAGE - 1)
        loaded.add(page)
        va = pa_to_va.get(page)
        data = bytes(PAGE)
        try:
            if va is None:
                raise RuntimeError("physical page %#x maps nothing" % page)
            mem.seek(va)
            data = mem.read(PAGE)
        except Exception as e:  # noqa: BLE001 - reported, the case then fails
            print("avx512_emu.py: page of %s: %s" % (hex(va) if va is not None else "?", e), flush=True)
        hva = bochscpu.memory.allocate_host_page()
        bochscpu.memory.page_insert(page, hva)
        bochscpu.memory.phy_write(page, bytearray(data))

    # virt_read / virt_write from here need the pages present (only the CPU calls missing_page); pages
    # outside the harness's mappings (the probe page) are present from the start.
    def ensure(va, size):
        for p in range(va & ~(PAGE - 1), va + size, PAGE):
            pa = va_to_pa.get(p)
            if pa is not None and pa not in loaded:
                missing_page(pa)

    sess = bochscpu.Session()
    sess.missing_page_handler = missing_page
    state = bochscpu.State()
    bochscpu.cpu.set_long_mode(state)
    cr0 = bochscpu.utils.cpu.CR0(state.cr0)
    cr4 = bochscpu.utils.cpu.CR4(state.cr4)
    cr0.MP, cr0.EM, cr4.OSFXSR, cr4.OSXSAVE = True, False, True, True
    state.cr0, state.cr4 = int(cr0), int(cr4)
    state.cr4 |= 1 << 10                   # OSXMMEXCPT
    state.xcr0 = 0xE7                      # x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
    state.cr3 = PML4
    state.mxcsr, state.mxcsr_mask, state.fpcw = 0x1F80, 0xFFFF, 0x37F
    code = bochscpu.Segment()
    code.base, code.limit, code.selector = 0, 0xFFFF_FFFF, 0x33
    flags = bochscpu.cpu.SegmentFlags()
    flags.A = flags.R = flags.E = flags.S = flags.P = flags.L = True
    code.attr = int(flags)

    def data_segment(selector, base=0):
        s = bochscpu.Segment()
        s.base, s.limit, s.selector, s.attr = base, 0xFFFF_FFFF, selector, 0xCF3
        return s

    state.cs, state.ss, state.ds, state.es = code, data_segment(0x2B), data_segment(0), data_segment(0)
    state.fs, state.gs = data_segment(0, meta["fs_base"]), data_segment(0)
    state.rflags = 0x202

    result = {}

    def on_exception(sess, cpu_id, vector, error_code):
        result["fault"] = (vector, error_code, sess.cpu.rip, sess.cpu.cr2)
        sess.stop()

    hook = bochscpu.Hook()
    hook.exception = on_exception

    def call(rip, rdi, stack_top):
        state.rip, state.rdi = rip, rdi
        state.rsp = ((stack_top - 64) & ~0xF) - 8  # as after a call: rsp + 8 is 16-byte aligned
        ensure(state.rsp, 8)
        bochscpu.memory.virt_write(PML4, state.rsp, bytearray(struct.pack("<Q", SENTINEL)))
        sess.cpu.state = state
        result.clear()
        sess.run([hook])
        vector, error_code, rip_end, cr2 = result.get("fault", (None, 0, 0, 0))
        return vector == 14 and rip_end == SENTINEL and cr2 == SENTINEL, result.get("fault")

    # CPUID leaf 7: the features this tier needs must be on the emulated CPU.
    # mov eax, 7; xor ecx, ecx; cpuid; mov [rdi], ebx; mov [rdi + 4], ecx; ret
    probe = bytes.fromhex("b807000000" "31c9" "0fa2" "891f" "894f04" "c3")
    bochscpu.memory.virt_write(PML4, probe_va, bytearray(probe))
    ok, fault = call(probe_va, probe_va + 0x800, probe_va + 0x700)
    ebx, ecx = struct.unpack("<II", bytes(bochscpu.memory.virt_read(PML4, probe_va + 0x800, 8)))
    need = {"avx512f": (ebx >> 16) & 1, "avx512dq": (ebx >> 17) & 1, "avx512bw": (ebx >> 30) & 1,
            "avx512vl": (ebx >> 31) & 1, "avx512_vnni": (ecx >> 11) & 1}
    if not ok or not all(need.values()):
        proc.kill()
        sys.exit("avx512_emu.py: the emulated CPU (model %d) lacks %s (probe fault %s)"
                 % (MODEL_INDEX, [k for k, v in need.items() if not v], fault))

    failed = 0
    t0 = time.time()
    for i, case in enumerate(meta["cases"]):
        ok, fault = call(meta["entry"], i, meta["stack_top"])
        if not ok:
            failed += 1
            vector, error_code, rip, cr2 = fault if fault else (None, 0, 0, 0)
            print("FAULT %s: exception %s (error %#x) at rip %#x, cr2 %#x" % (case["name"], vector, error_code,
                                                                              rip, cr2), flush=True)
            continue
        for addr, size in case["outs"]:
            ensure(addr, size)
            mem.seek(addr)
            mem.write(bytes(bochscpu.memory.virt_read(PML4, addr, size)))
    print("avx512_emu.py: %d cases on the emulated %s tier in %.1f s" % (len(meta["cases"]), meta["tier"],
                                                                         time.time() - t0), flush=True)
    mem.close()
    proc.stdin.write("checked\n")
    proc.stdin.flush()
    out = proc.stdout.read()
    sys.stdout.write(out)
    rc = proc.wait()
    return 1 if failed else rc


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    # Skips interpreter finalization, where nanobind lists the emulator's bound functions as leaks.
    os._exit(status)
