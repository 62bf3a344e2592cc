/*
 * launch.c: kernel and graph launches, timestamped per calling library.
 *
 * The profiler (seedance profile launches) needs, per library, when each launch was
 * made.  The hot path stays what the allocation path is: the real call first, then one
 * counter and, only with SEEDANCE_EVENTS=1, one ring event carrying the calling library
 * index (the inline return-address cache of registry.c: one relaxed load on a hit).  No
 * lock, no allocation, no logging; the launch's result is passed back untouched.  The
 * device is not asked (a cuCtxGetDevice per launch would double the cost): the profiler
 * attributes launches per library, not per device.
 */
#define _GNU_SOURCE
#include "impl.h"
#include "real.h"
#include "registry.h"

static inline CUresult launched(int api, void *caller, CUresult r)
{
    struct sd_slot *s = sd_slot;
    if (SD_LIKELY(s != NULL) && r == CUDA_SUCCESS) {
        /* a plain relaxed load and store, not a locked add: launches come in storms, and
         * a lock-prefixed add on the shared slot makes every launch wait for exclusive
         * ownership of its cache line (bench/bench_profiler.py times both);
         * concurrent launchers of one process may lose a count, which only a statistic
         * (api_calls) would show, never a decision */
        __atomic_store_n(&s->api_calls[api], __atomic_load_n(&s->api_calls[api], __ATOMIC_RELAXED) + 1,
                         __ATOMIC_RELAXED);
        if (sd_events_on)
            sd_event(SD_EV_LAUNCH, api, -1, r, 0, 0, sd_lib_index(caller), NULL);
    }
    return r;
}

#define REAL_OR(name)                       \
    __typeof__(&name) real = SD_REAL(name); \
    if (!real)                              \
        return CUDA_ERROR_NOT_INITIALIZED;

CUresult sd_impl_cuLaunchKernel(void *caller, CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                                CUstream stream, void **params, void **extra)
{
    REAL_OR(cuLaunchKernel);
    return launched(SD_HOOK_cuLaunchKernel, caller, real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra));
}

CUresult sd_impl_cuLaunchKernelEx(void *caller, const CUlaunchConfig *config, CUfunction f, void **params,
                                  void **extra)
{
    REAL_OR(cuLaunchKernelEx);
    return launched(SD_HOOK_cuLaunchKernelEx, caller, real(config, f, params, extra));
}

CUresult sd_impl_cuLaunchCooperativeKernel(void *caller, CUfunction f, unsigned int gx, unsigned int gy,
                                           unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                                           unsigned int shared, CUstream stream, void **params)
{
    REAL_OR(cuLaunchCooperativeKernel);
    return launched(SD_HOOK_cuLaunchCooperativeKernel, caller,
                    real(f, gx, gy, gz, bx, by, bz, shared, stream, params));
}

CUresult sd_impl_cuGraphLaunch(void *caller, CUgraphExec exec, CUstream stream)
{
    REAL_OR(cuGraphLaunch);
    return launched(SD_HOOK_cuGraphLaunch, caller, real(exec, stream));
}
