#!/usr/bin/env python3
"""Compiles CUDA sources with NVRTC exactly as the library does at run time (no include, no
option), so that a kernel that would fail to compile on the GPU machine fails on the build
machine instead. Used by `scripts/build_cuda.sh`; needs the `libnvrtc.so` of the CUDA wheels.

usage: nvrtc_check.py LIBNVRTC_SO FILE.cu...
"""
import ctypes
import sys


def check(lib, path):
    src = open(path, "rb").read()
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src, path.encode(), 0, None, None)
    if rc != 0:
        return f"nvrtcCreateProgram returned {rc}"
    rc = lib.nvrtcCompileProgram(prog, 0, None)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    ptx_size = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(ptx_size))
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    text = log.value.decode(errors="replace").strip()
    if rc != 0:
        return f"compilation failed (nvrtc {rc}):\n{text}"
    print(f"nvrtc: {path}: {ptx_size.value} bytes of PTX" + (f"\n{text}" if text else ""))
    return None


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    lib = ctypes.CDLL(sys.argv[1])
    failed = False
    for path in sys.argv[2:]:
        err = check(lib, path)
        if err:
            print(f"nvrtc: {path}: {err}", file=sys.stderr)
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
