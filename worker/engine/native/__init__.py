"""A native (C) forward of Llama-family decoders with 4-bit / 8-bit grouped weights (`quantization = "q4"`).

build.py compiles forward.c once per source, flags, compiler and CPU; pack.py turns float weights into its grouped
codes; model.py holds a runner's packed weights and calls the forward through ctypes, once bounds.py has
checked every index of the call.
"""
