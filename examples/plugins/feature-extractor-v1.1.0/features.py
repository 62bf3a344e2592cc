"""Bench callable of feature-extractor 1.1.0: the frame is normalised once (the merge that
`seedance profile calls` suggested for 1.0.0) and both feature paths reuse it."""
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


def band_energies(normalised):
    data = (ctypes.c_double * len(normalised))(*normalised)
    out = (ctypes.c_double * BANDS)()
    if _LIB.feat_band_energy(data, len(normalised), BANDS, out) != BANDS:
        raise RuntimeError("feat_band_energy failed")
    return list(out)


def spectral_features(normalised):
    return band_energies(normalised)


def energy_features(normalised):
    return [max(normalised), min(normalised), sum(abs(x) for x in normalised) / len(normalised)]


def extract_batch(batch):
    results = []
    for seed in batch:
        normalised = zscore(synth(int(seed)))
        results.append((spectral_features(normalised), energy_features(normalised)))
    return results
