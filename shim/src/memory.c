/*
 * memory.c: allocation accounting and quotas.
 *
 * Order of operations for every allocation (the quota can never be overcommitted, as
 * seen from the driver):  reserve in the group (CAS, fails -> CUDA_ERROR_OUT_OF_MEMORY
 * without calling the driver) -> real allocation -> on failure roll the reservation
 * back, on success record it.  For frees: real free first, then release, so the
 * driver's outstanding bytes are always <= the group's reservation.
 *
 * The hot path takes no lock, calls no malloc and writes no log: one CAS for the quota
 * and one for the record, two counters (per API, per calling library); a free is a
 * record CAS and the quota release.  What an instance holds is the sum of its records,
 * so there is no per-instance byte counter to keep in step (bench/bench_shim.py).  Per-allocation events go to
 * the ring only with SEEDANCE_EVENTS=1.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "impl.h"
#include "registry.h"

/* the library that called cudaMalloc, for the driver call it makes underneath */
static __thread void *sd_runtime_caller __attribute__((tls_model("initial-exec")));

static inline void group_peak(struct sd_group *g, int dev, uint64_t now)
{
    uint64_t peak = __atomic_load_n(&g->peak[dev], __ATOMIC_RELAXED);
    while (SD_UNLIKELY(now > peak) &&
           !__atomic_compare_exchange_n(&g->peak[dev], &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static inline int quota_reserve(int dev, uint64_t bytes)
{
    struct sd_group *g = sd_group;
    if (!g)
        return 1;
    uint64_t limit = g->limit[dev];
    if (!limit) {
        group_peak(g, dev, __atomic_add_fetch(&g->used[dev], bytes, __ATOMIC_RELAXED));
        return 1;
    }
    uint64_t used = __atomic_load_n(&g->used[dev], __ATOMIC_RELAXED);
    do {
        if (bytes > limit || used > limit - bytes)
            return 0;
    } while (!__atomic_compare_exchange_n(&g->used[dev], &used, used + bytes, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
    group_peak(g, dev, used + bytes);
    return 1;
}

static inline void quota_release(int dev, uint64_t bytes)
{
    if (sd_group)
        __atomic_fetch_sub(&sd_group->used[dev], bytes, __ATOMIC_RELEASE);
}

static CUresult refuse(int api, int dev, uint64_t bytes)
{
    if (sd_group)
        __atomic_fetch_add(&sd_group->refused[dev], 1, __ATOMIC_RELAXED);
    if (sd_slot)
        __atomic_fetch_add(&sd_slot->refused[dev], 1, __ATOMIC_RELAXED);
    sd_event(SD_EV_QUOTA_REFUSED, api, dev, CUDA_ERROR_OUT_OF_MEMORY, 0, bytes, 0, NULL);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static inline void account_alloc(uint64_t key, uint64_t bytes, int dev, int api, void *caller)
{
    struct sd_slot *s = sd_slot;
    if (!s)
        return;
    void *rt = sd_runtime_caller;
    uint32_t lib = sd_lib_index(rt ? rt : caller);
    __atomic_fetch_add(&s->api_calls[api], 1, __ATOMIC_RELAXED);
    if (lib < SD_MAX_LIBS)
        __atomic_fetch_add(&s->libs[lib].allocs, 1, __ATOMIC_RELAXED);
    sd_record_insert(key, bytes, dev, api, lib);
    if (sd_events_on)
        sd_event(SD_EV_ALLOC, api, dev, 0, key, bytes, lib, NULL);
}

/* Forget an allocation after the driver freed it.  An allocation the record table had
 * no room for is sized through the driver before the free (sizeq). */
static inline void account_free(uint64_t key, int api, uint64_t untracked_size, int untracked_dev)
{
    uint64_t bytes;
    int dev;
    if (!sd_record_take(key, &bytes, &dev)) {
        if (!untracked_size)
            return;
        bytes = untracked_size;
        dev = untracked_dev;
    }
    if (dev < 0 || dev >= SD_MAX_DEVICES)
        return;
    (void)api;
    quota_release(dev, bytes);
    if (sd_events_on)
        sd_event(SD_EV_FREE, api, dev, 0, key, bytes, 0, NULL);
}

static uint64_t untracked_size(CUdeviceptr p, int *dev)
{
    if (!sd_slot || !__atomic_load_n(&sd_slot->untracked, __ATOMIC_RELAXED) || sd_record_find(p) >= 0)
        return 0;
    CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr) =
        (CUresult(*)(CUdeviceptr *, size_t *, CUdeviceptr))sd_real(SD_HOOK_cuMemGetAddressRange_v2);
    CUdeviceptr base;
    size_t size = 0;
    *dev = sd_current_device();
    if (!range || range(&base, &size, p) != CUDA_SUCCESS || base != p)
        return 0;
    return size;
}

/* The common shape of every pointer-returning allocation. */
#define ALLOC_BODY(api, bytes, call)                                          \
    do {                                                                      \
        int dev = sd_current_device();                                        \
        if (dev < 0)                                                          \
            return call; /* no context: the driver reports the error */      \
        if (!quota_reserve(dev, (bytes)))                                     \
            return refuse(api, dev, (bytes));                                 \
        CUresult r_ = call;                                                   \
        if (r_ != CUDA_SUCCESS) {                                             \
            quota_release(dev, (bytes));                                      \
            return r_;                                                        \
        }                                                                     \
        account_alloc(*dptr, (bytes), dev, api, caller);                      \
        return r_;                                                            \
    } while (0)

#define REAL_OR(name, err)                  \
    __typeof__(&name) real = SD_REAL(name); \
    if (!real)                              \
        return err;

CUresult sd_impl_cuMemAlloc_v2(void *caller, CUdeviceptr *dptr, size_t bytesize)
{
    REAL_OR(cuMemAlloc_v2, CUDA_ERROR_NOT_INITIALIZED);
    ALLOC_BODY(SD_HOOK_cuMemAlloc_v2, bytesize, real(dptr, bytesize));
}

CUresult sd_impl_cuMemAllocManaged(void *caller, CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    REAL_OR(cuMemAllocManaged, CUDA_ERROR_NOT_INITIALIZED);
    ALLOC_BODY(SD_HOOK_cuMemAllocManaged, bytesize, real(dptr, bytesize, flags));
}

/* Stream-ordered allocations are accounted when enqueued (the device is the current
 * context's; a stream of another context is rare and documented). */
CUresult sd_impl_cuMemAllocAsync(void *caller, CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    REAL_OR(cuMemAllocAsync, CUDA_ERROR_NOT_INITIALIZED);
    ALLOC_BODY(SD_HOOK_cuMemAllocAsync, bytesize, real(dptr, bytesize, hStream));
}

CUresult sd_impl_cuMemAllocAsync_ptsz(void *caller, CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    REAL_OR(cuMemAllocAsync_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    ALLOC_BODY(SD_HOOK_cuMemAllocAsync_ptsz, bytesize, real(dptr, bytesize, hStream));
}

CUresult sd_impl_cuMemAllocFromPoolAsync(void *caller, CUdeviceptr *dptr, size_t bytesize,
                                         CUmemoryPool pool, CUstream hStream)
{
    REAL_OR(cuMemAllocFromPoolAsync, CUDA_ERROR_NOT_INITIALIZED);
    ALLOC_BODY(SD_HOOK_cuMemAllocFromPoolAsync, bytesize, real(dptr, bytesize, pool, hStream));
}

CUresult sd_impl_cuMemAllocFromPoolAsync_ptsz(void *caller, CUdeviceptr *dptr, size_t bytesize,
                                              CUmemoryPool pool, CUstream hStream)
{
    REAL_OR(cuMemAllocFromPoolAsync_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    ALLOC_BODY(SD_HOOK_cuMemAllocFromPoolAsync_ptsz, bytesize, real(dptr, bytesize, pool, hStream));
}

/* The pitch is only known afterwards: reserve the driver's minimum (rows padded to
 * 512 bytes, its pitch alignment), then settle the difference. */
CUresult sd_impl_cuMemAllocPitch_v2(void *caller, CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                    size_t Height, unsigned int ElementSizeBytes)
{
    REAL_OR(cuMemAllocPitch_v2, CUDA_ERROR_NOT_INITIALIZED);
    int dev = sd_current_device();
    if (dev < 0)
        return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t guess = (uint64_t)((WidthInBytes + 511) & ~(size_t)511) * Height;
    if (!quota_reserve(dev, guess))
        return refuse(SD_HOOK_cuMemAllocPitch_v2, dev, guess);
    CUresult r = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS) {
        quota_release(dev, guess);
        return r;
    }
    uint64_t actual = (uint64_t)*pPitch * Height;
    if (actual > guess && sd_group)
        __atomic_fetch_add(&sd_group->used[dev], actual - guess, __ATOMIC_RELAXED);
    else if (actual < guess)
        quota_release(dev, guess - actual);
    account_alloc(*dptr, actual, dev, SD_HOOK_cuMemAllocPitch_v2, caller);
    return r;
}

/* VMM: only device-located physical memory counts against a device quota; the
 * location id is an ordinal the application sees, so it is remapped too. */
CUresult sd_impl_cuMemCreate(void *caller, CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    REAL_OR(cuMemCreate, CUDA_ERROR_NOT_INITIALIZED);
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
        sd_count_call(SD_HOOK_cuMemCreate);
        return real(handle, size, prop, flags);
    }
    int dev = sd_logical_to_physical(prop->location.id);
    if (dev < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    CUmemAllocationProp remapped = *prop;
    remapped.location.id = dev;
    if (dev >= SD_MAX_DEVICES)
        return real(handle, size, &remapped, flags);
    if (!quota_reserve(dev, size))
        return refuse(SD_HOOK_cuMemCreate, dev, size);
    CUresult r = real(handle, size, &remapped, flags);
    if (r != CUDA_SUCCESS) {
        quota_release(dev, size);
        return r;
    }
    account_alloc((uint64_t)*handle | SD_HANDLE_TAG, size, dev, SD_HOOK_cuMemCreate, caller);
    return r;
}

CUresult sd_impl_cuMemRelease(void *caller, CUmemGenericAllocationHandle handle)
{
    (void)caller;
    REAL_OR(cuMemRelease, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real(handle);
    if (r == CUDA_SUCCESS)
        account_free((uint64_t)handle | SD_HANDLE_TAG, SD_HOOK_cuMemRelease, 0, -1);
    return r;
}

CUresult sd_impl_cuMemFree_v2(void *caller, CUdeviceptr dptr)
{
    (void)caller;
    REAL_OR(cuMemFree_v2, CUDA_ERROR_NOT_INITIALIZED);
    int dev = -1;
    uint64_t extra = untracked_size(dptr, &dev);
    CUresult r = real(dptr);
    if (r == CUDA_SUCCESS && dptr)
        account_free(dptr, SD_HOOK_cuMemFree_v2, extra, dev);
    return r;
}

CUresult sd_impl_cuMemFreeAsync(void *caller, CUdeviceptr dptr, CUstream hStream)
{
    (void)caller;
    REAL_OR(cuMemFreeAsync, CUDA_ERROR_NOT_INITIALIZED);
    int dev = -1;
    uint64_t extra = untracked_size(dptr, &dev);
    CUresult r = real(dptr, hStream);
    if (r == CUDA_SUCCESS && dptr)
        account_free(dptr, SD_HOOK_cuMemFreeAsync, extra, dev);
    return r;
}

CUresult sd_impl_cuMemFreeAsync_ptsz(void *caller, CUdeviceptr dptr, CUstream hStream)
{
    (void)caller;
    REAL_OR(cuMemFreeAsync_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    int dev = -1;
    uint64_t extra = untracked_size(dptr, &dev);
    CUresult r = real(dptr, hStream);
    if (r == CUDA_SUCCESS && dptr)
        account_free(dptr, SD_HOOK_cuMemFreeAsync_ptsz, extra, dev);
    return r;
}

/* The quota view: a job limited to 4G sees a 4G device, so frameworks that size their
 * caches from cuMemGetInfo stay inside it. */
CUresult sd_impl_cuMemGetInfo_v2(void *caller, size_t *free, size_t *total)
{
    (void)caller;
    REAL_OR(cuMemGetInfo_v2, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real(free, total);
    int dev;
    if (r != CUDA_SUCCESS || !sd_group || (dev = sd_current_device()) < 0 || !sd_group->limit[dev])
        return r;
    uint64_t limit = sd_group->limit[dev];
    uint64_t used = __atomic_load_n(&sd_group->used[dev], __ATOMIC_RELAXED);
    uint64_t left = used < limit ? limit - used : 0;
    if (total && *total > limit)
        *total = limit;
    if (free && *free > left)
        *free = left;
    return r;
}

CUresult sd_impl_cuDeviceTotalMem_v2(void *caller, size_t *bytes, CUdevice dev)
{
    (void)caller;
    REAL_OR(cuDeviceTotalMem_v2, CUDA_ERROR_NOT_INITIALIZED);
    if (!sd_device_visible(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = real(bytes, dev);
    if (r == CUDA_SUCCESS && bytes && sd_group && dev >= 0 && dev < SD_MAX_DEVICES &&
        sd_group->limit[dev] && *bytes > sd_group->limit[dev])
        *bytes = sd_group->limit[dev];
    return r;
}

/* cudaMalloc's own driver call is accounted by cuMemAlloc_v2's hook; this only names
 * the library that called the runtime instead of libcudart itself. */
cudaError_t sd_impl_cudaMalloc(void *caller, void **devPtr, size_t size)
{
    REAL_OR(cudaMalloc, cudaErrorInsufficientDriver);
    sd_count_call(SD_HOOK_cudaMalloc);
    sd_runtime_caller = caller;
    cudaError_t r = real(devPtr, size);
    sd_runtime_caller = NULL;
    return r;
}

cudaError_t sd_impl_cudaFree(void *caller, void *devPtr)
{
    REAL_OR(cudaFree, cudaErrorInsufficientDriver);
    sd_count_call(SD_HOOK_cudaFree);
    sd_runtime_caller = caller;
    cudaError_t r = real(devPtr);
    sd_runtime_caller = NULL;
    return r;
}
