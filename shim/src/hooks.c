/*
 * hooks.c: the exported wrappers, generated from hooks.def.
 *
 * Every wrapper is the same three steps: one load of sd_mode; when the shim is not
 * active (not started yet, SEEDANCE_DISABLE=1, version mismatch, a child that is not
 * followed) forward to the real function untouched; else call the area's
 * sd_impl_<name>() with the caller's return address.  Every path checks for a NULL
 * real function (no driver: the documented error code, never a crash).
 *
 * Also here: cuGetProcAddress, which hands the wrappers out by name, so it lives with them
 * (the wrappers call it as they call every area; it needs the wrappers themselves).
 */
#define _GNU_SOURCE
#include <string.h>

#include "config.h"
#include "hooks.h"
#include "impl.h"
#include "init.h"
#include "real.h"

#define HOOK(ret, name, proc, since, flags, noreal, params, args)                     \
    SD_EXPORT ret name params                                                          \
    {                                                                                  \
        if (SD_UNLIKELY(__atomic_load_n(&sd_mode, __ATOMIC_ACQUIRE) != SD_MODE_ACTIVE)) { \
            if (__atomic_load_n(&sd_mode, __ATOMIC_ACQUIRE) == SD_MODE_UNINIT)          \
                sd_init();                                                             \
            if (__atomic_load_n(&sd_mode, __ATOMIC_ACQUIRE) != SD_MODE_ACTIVE) {        \
                ret (*real_) params = (ret (*) params)sd_real(SD_HOOK_##name);        \
                return real_ ? real_ args : (ret)(noreal);                             \
            }                                                                          \
        }                                                                              \
        return sd_impl_##name(__builtin_return_address(0), SD_UNPAREN args);          \
    }
#include "hooks.def"

void *const sd_wrappers[SD_HOOK_COUNT] = {
#define HOOK(ret, name, proc, since, flags, noreal, params, args) [SD_HOOK_##name] = (void *)&name,
#define DRIVER(name, proc, since) [SD_HOOK_##name] = NULL,
#include "hooks.def"
};

/*
 * cuGetProcAddress and cuGetProcAddress_v2.
 *
 * Since CUDA 11.3 libcudart fetches every driver entry point through cuGetProcAddress,
 * before cuInit, by base name plus the cudaVersion it was built for ("cuMemAlloc",
 * 12000 -> cuMemAlloc_v2).  The real driver answers first (it knows every version and
 * fills symbolStatus); the shim then swaps in its wrapper for the same (name, version,
 * per-thread-stream) entry of hooks.def, and records the driver's answer as the real
 * function behind that wrapper.  Asked for cuGetProcAddress itself, it returns itself.
 */
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
    if (*pfn != sd_wrappers[hook])
        sd_set_real(hook, *pfn);
    *pfn = sd_wrappers[hook];
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
