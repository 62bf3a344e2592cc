"""Bench callable of the audio-encoder plugin: encode one batch of synthetic frames.

`seedance bench` calls encode_batch(batch) through seedance.plugins.batching; each request is an
integer that picks one of 64 synthetic 1024-sample frames.
"""
import ctypes
import math
import os

FRAME, BANDS = 1024, 64
FRAMES = 64  # distinct synthetic frames, made once: the bench measures the plugin, not Python
_LIB = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libaudioenc.so"))
_LIB.audioenc_encode_batch.argtypes = (ctypes.POINTER(ctypes.c_float), ctypes.c_int,
                                       ctypes.POINTER(ctypes.c_uint8))
_LIB.audioenc_encode_batch.restype = ctypes.c_int


_SYNTH = [(ctypes.c_float * FRAME)(*[math.sin(0.01 * (seed + 1) * n) for n in range(FRAME)])
          for seed in range(FRAMES)]


def encode_batch(batch):
    pcm = (ctypes.c_float * (FRAME * len(batch)))()
    for index, seed in enumerate(batch):
        ctypes.memmove(ctypes.byref(pcm, index * FRAME * 4), _SYNTH[int(seed) % FRAMES], FRAME * 4)
    out = (ctypes.c_uint8 * (BANDS * len(batch)))()
    if _LIB.audioenc_encode_batch(pcm, len(batch), out) != len(batch):
        raise RuntimeError("audioenc_encode_batch failed")
    return [bytes(out[i * BANDS:(i + 1) * BANDS]) for i in range(len(batch))]
