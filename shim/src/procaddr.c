/*
 * procaddr.c: cuGetProcAddress and cuGetProcAddress_v2.
 *
 * Since CUDA 11.3 libcudart fetches every driver entry point through cuGetProcAddress,
 * before cuInit, by base name plus the cudaVersion it was built for ("cuMemAlloc",
 * 12000 -> cuMemAlloc_v2).  The real driver answers first (it knows every version and
 * fills symbolStatus); the shim then swaps in its wrapper for the same (name, version,
 * per-thread-stream) entry of hooks.def, and records the driver's answer as the real
 * function behind that wrapper.  Asked for cuGetProcAddress itself, it returns itself.
 */
#define _GNU_SOURCE
#include <string.h>

#include "shim.h"

/* the hook handed out for (symbol, cudaVersion, flags), or -1: pass the driver's answer through */
static int choose_hook(const char *symbol, int cudaVersion, cuuint64_t flags)
{
    int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1, best_ptsz = -1;
    for (int i = 0; i < SD_HOOK_COUNT; i++) {
        const struct sd_hook_info *h = &sd_hooks[i];
        if (!h->wrapped || (h->flags & SD_HF_RUNTIME) || h->since > cudaVersion || strcmp(h->proc, symbol) != 0)
            continue;
        if (h->flags & SD_HF_PTSZ) {
            if (ptsz && (best_ptsz < 0 || sd_hooks[best_ptsz].since < h->since))
                best_ptsz = i;
        } else if (best < 0 || sd_hooks[best].since < h->since) {
            best = i;
        }
    }
    return best_ptsz >= 0 ? best_ptsz : best;
}

static CUresult wrap_answer(CUresult r, const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status)
{
    if (r != CUDA_SUCCESS || !symbol || !pfn || !*pfn)
        return r;
    if (status && *status != CU_GET_PROC_ADDRESS_SUCCESS)
        return r;
    int hook = choose_hook(symbol, cudaVersion, flags);
    if (hook < 0)
        return r;
    sd_set_real(hook, *pfn);
    *pfn = sd_hooks[hook].wrapper;
    return r;
}

CUresult sd_impl_cuGetProcAddress(void *caller, const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    (void)caller;
    __typeof__(&cuGetProcAddress) real = SD_REAL(cuGetProcAddress);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    return wrap_answer(real(symbol, pfn, cudaVersion, flags), symbol, pfn, cudaVersion, flags, NULL);
}

CUresult sd_impl_cuGetProcAddress_v2(void *caller, const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    (void)caller;
    __typeof__(&cuGetProcAddress_v2) real = SD_REAL(cuGetProcAddress_v2);
    if (!real) {
        if (symbolStatus)
            *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    return wrap_answer(r, symbol, pfn, cudaVersion, flags, symbolStatus);
}
