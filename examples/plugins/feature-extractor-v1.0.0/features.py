"""Bench callable of feature-extractor 1.0.0: spectral and energy features per frame.

Both feature paths normalise the frame, each with its own z-score: zscore() in the spectral
path and standardize(), a slower twin with a scratch buffer, in the energy path.  They
compute the same values (same operations, same order), so the frame is normalised twice.
"""
import ctypes
import math
import os

FRAME, BANDS = 2048, 16
_LIB = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libfeat.so"))
_LIB.feat_band_energy.argtypes = (ctypes.POINTER(ctypes.c_double), ctypes.c_int, ctypes.c_int,
                                  ctypes.POINTER(ctypes.c_double))
_LIB.feat_band_energy.restype = ctypes.c_int


def synth(seed):
    return [math.sin(0.003 * (seed + 1) * n) + 0.25 * math.sin(0.07 * n) for n in range(FRAME)]


def zscore(frame):
    mean = sum(frame) / len(frame)
    std = math.sqrt(sum((x - mean) ** 2 for x in frame) / len(frame))
    return [(x - mean) / std for x in frame]


def standardize(frame):
    scratch = bytearray(8 << 20)  # a staging buffer the energy path never needed
    values = list(frame)
    for _ in range(4):  # re-validates the copy each time: the waste that makes this twin dearer
        if not all(math.isfinite(x) for x in values):
            raise ValueError("non-finite sample")
    mean = sum(values) / len(values)
    std = math.sqrt(sum((x - mean) ** 2 for x in values) / len(values))
    out = []
    for x in values:
        out.append((x - mean) / std)
    scratch[0] = 1
    return out


def band_energies(normalised):
    data = (ctypes.c_double * len(normalised))(*normalised)
    out = (ctypes.c_double * BANDS)()
    if _LIB.feat_band_energy(data, len(normalised), BANDS, out) != BANDS:
        raise RuntimeError("feat_band_energy failed")
    return list(out)


def spectral_features(frame):
    return band_energies(zscore(frame))


def energy_features(frame):
    normalised = standardize(frame)
    return [max(normalised), min(normalised), sum(abs(x) for x in normalised) / len(normalised)]


def extract_batch(batch):
    results = []
    for seed in batch:
        frame = synth(int(seed))
        results.append((spectral_features(frame), energy_features(frame)))
    return results
