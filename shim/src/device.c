/*
 * device.c: device affinity.  The process sees only the devices named in
 * SEEDANCE_AFFINITY, as ordinals 0..n-1, in the order given.
 *
 * SEEDANCE_AFFINITY uses the grammar of CUDA_VISIBLE_DEVICES: a comma-separated list
 * of ordinals, GPU-<uuid> or MIG-<uuid> (any unique prefix), plus the product notes'
 * spelling npuN.  As with CUDA_VISIBLE_DEVICES the list stops at the first entry that
 * names no device or repeats one.  Ordinals are the driver's own numbering, which
 * already honours CUDA_DEVICE_ORDER and any CUDA_VISIBLE_DEVICES in the environment;
 * `seedance run` turns gpu:N into the UUID of NVML index N when NVML is present, so
 * that N means what nvidia-smi shows.
 *
 * The CUdevice handles handed out are the driver's real ones (handle == ordinal in the
 * driver), so every API that takes a CUdevice keeps working unwrapped; the hooks that
 * take one refuse handles outside the visible set.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "device.h"
#include "impl.h"
#include "registry.h"

static pthread_mutex_t sd_device_lock = PTHREAD_MUTEX_INITIALIZER;
static int sd_device_resolved;
static int sd_nvisible = -1;
static int sd_visible[SD_MAX_DEVICES];

static void format_uuid(char *out, size_t len, const char *prefix, const CUuuid *u)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, len, "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             prefix, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
             b[12], b[13], b[14], b[15]);
}

static int device_uuid(int ordinal, const char *prefix, char *out, size_t len)
{
    CUresult (*get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))sd_real(SD_HOOK_cuDeviceGet);
    CUresult (*uuid_v2)(CUuuid *, CUdevice) = (CUresult(*)(CUuuid *, CUdevice))sd_real(SD_HOOK_cuDeviceGetUuid_v2);
    CUresult (*uuid_v1)(CUuuid *, CUdevice) = (CUresult(*)(CUuuid *, CUdevice))sd_real(SD_HOOK_cuDeviceGetUuid);
    CUdevice dev;
    CUuuid u;
    if (!get || get(&dev, ordinal) != CUDA_SUCCESS)
        return -1;
    /* _v2 returns the MIG instance's UUID where v1 returns its parent GPU's */
    if (strcmp(prefix, "MIG-") == 0 ? !(uuid_v2 && uuid_v2(&u, dev) == CUDA_SUCCESS)
                                     : !((uuid_v1 && uuid_v1(&u, dev) == CUDA_SUCCESS) ||
                                         (uuid_v2 && uuid_v2(&u, dev) == CUDA_SUCCESS)))
        return -1;
    format_uuid(out, len, prefix, &u);
    return 0;
}

/* one CUDA_VISIBLE_DEVICES item -> driver ordinal, or -1 */
static int resolve_item(const char *item, int ndevices)
{
    while (isspace((unsigned char)*item))
        item++;
    if (strncasecmp(item, "npu", 3) == 0)
        item += 3;
    else if (strncasecmp(item, "gpu:", 4) == 0)
        item += 4;
    if (isdigit((unsigned char)*item)) {
        char *end;
        long v = strtol(item, &end, 10);
        while (isspace((unsigned char)*end))
            end++;
        return (*end == '\0' && v >= 0 && v < ndevices) ? (int)v : -1;
    }
    const char *prefix = strncasecmp(item, "MIG-", 4) == 0 ? "MIG-" : strncasecmp(item, "GPU-", 4) == 0 ? "GPU-" : NULL;
    if (!prefix)
        return -1;
    size_t len = strlen(item);
    while (len && isspace((unsigned char)item[len - 1]))
        len--;
    int match = -1;
    for (int d = 0; d < ndevices; d++) {
        char uuid[64];
        if (device_uuid(d, prefix, uuid, sizeof uuid) == 0 && strncasecmp(uuid, item, len) == 0) {
            if (match >= 0)
                return -1; /* ambiguous prefix */
            match = d;
        }
    }
    return match;
}

/* set while this thread resolves: a driver that calls its own exported entry points
 * (through its PLT, so through our wrappers) must not re-enter the lock */
static __thread int sd_resolving __attribute__((tls_model("initial-exec")));

void sd_device_resolve(void)
{
    if (SD_LIKELY(__atomic_load_n(&sd_device_resolved, __ATOMIC_ACQUIRE)) || sd_resolving)
        return;
    pthread_mutex_lock(&sd_device_lock);
    sd_resolving = 1;
    if (sd_device_resolved)
        goto out;
    CUresult (*count)(int *) = (CUresult(*)(int *))sd_real(SD_HOOK_cuDeviceGetCount);
    int n = 0;
    if (!count || count(&n) != CUDA_SUCCESS)
        goto out; /* cuInit not called yet: try again on the next device call */
    if (n > SD_MAX_DEVICES)
        n = SD_MAX_DEVICES;
    const char *spec = sd_cfg.affinity; /* read once, before main (init.c) */
    if (spec && *spec) {
        char buf[512], text[SD_EVENT_TEXT];
        snprintf(buf, sizeof buf, "%s", spec);
        int nvis = 0;
        for (char *save = NULL, *item = strtok_r(buf, ",", &save); item && nvis < SD_MAX_DEVICES;
             item = strtok_r(NULL, ",", &save)) {
            int d = resolve_item(item, n);
            int dup = 0;
            for (int k = 0; k < nvis; k++)
                dup |= sd_visible[k] == d;
            if (d < 0 || dup)
                break;
            sd_visible[nvis++] = d;
        }
        sd_nvisible = nvis;
        int off = snprintf(text, sizeof text, "affinity %.120s:", spec); /* the event text is 192 bytes */
        for (int k = 0; k < nvis && off > 0 && (size_t)off < sizeof text; k++)
            off += snprintf(text + off, sizeof text - (size_t)off, " %d->%d", k, sd_visible[k]);
        sd_event(SD_EV_REMAP, -1, -1, nvis, 0, 0, 0, text);
        if (nvis == 0)
            sd_note("SEEDANCE_AFFINITY=%s names no device of %d: the process sees none", spec, n);
    }
    if (sd_slot) {
        sd_slot->ndevices = n;
        for (int k = 0; k < sd_nvisible; k++)
            sd_slot->visible[k] = sd_visible[k];
        __atomic_store_n(&sd_slot->nvisible, sd_nvisible, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&sd_device_resolved, 1, __ATOMIC_RELEASE);
out:
    sd_resolving = 0;
    pthread_mutex_unlock(&sd_device_lock);
}

int sd_device_visible(CUdevice dev)
{
    sd_device_resolve();
    if (sd_nvisible < 0)
        return 1;
    for (int k = 0; k < sd_nvisible; k++)
        if (sd_visible[k] == dev)
            return 1;
    return 0;
}

/* The hooks' fast path, inlined: no affinity (the common case) is one load each of two
 * globals, no call (the interposed-but-not-accounted calls, which a CUDA program makes
 * in the millions, must cost next to nothing over the real call) */
static inline int visible(CUdevice dev)
{
    if (SD_LIKELY(__atomic_load_n(&sd_device_resolved, __ATOMIC_ACQUIRE) && sd_nvisible < 0))
        return 1;
    return sd_device_visible(dev);
}

int sd_logical_to_physical(int ordinal)
{
    sd_device_resolve();
    if (sd_nvisible < 0)
        return ordinal;
    return (ordinal >= 0 && ordinal < sd_nvisible) ? sd_visible[ordinal] : -1;
}


#define REAL_OR(name, err)                 \
    __typeof__(&name) real = SD_REAL(name); \
    if (!real)                             \
        return err;

CUresult sd_impl_cuInit(void *caller, unsigned int Flags)
{
    (void)caller;
    REAL_OR(cuInit, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real(Flags);
    if (r == CUDA_SUCCESS) {
        sd_device_resolve();
        sd_count_call(SD_HOOK_cuInit);
        if (sd_nvisible == 0)
            return CUDA_ERROR_NO_DEVICE; /* what the driver says for an empty CUDA_VISIBLE_DEVICES */
    }
    return r;
}

CUresult sd_impl_cuDeviceGetCount(void *caller, int *count)
{
    (void)caller;
    REAL_OR(cuDeviceGetCount, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real(count);
    if (r == CUDA_SUCCESS && count) {
        sd_device_resolve();
        if (sd_nvisible >= 0)
            *count = sd_nvisible;
    }
    return r;
}

CUresult sd_impl_cuDeviceGet(void *caller, CUdevice *device, int ordinal)
{
    (void)caller;
    REAL_OR(cuDeviceGet, CUDA_ERROR_NOT_INITIALIZED);
    sd_device_resolve();
    if (sd_nvisible >= 0) {
        if (ordinal < 0 || ordinal >= sd_nvisible)
            return CUDA_ERROR_INVALID_DEVICE;
        ordinal = sd_visible[ordinal];
    }
    return real(device, ordinal);
}

CUresult sd_impl_cuDeviceGetByPCIBusId(void *caller, CUdevice *dev, const char *pciBusId)
{
    (void)caller;
    REAL_OR(cuDeviceGetByPCIBusId, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real(dev, pciBusId);
    if (r == CUDA_SUCCESS && dev && !visible(*dev))
        return CUDA_ERROR_INVALID_DEVICE;
    return r;
}

CUresult sd_impl_cuDeviceGetUuid(void *caller, CUuuid *uuid, CUdevice dev)
{
    (void)caller;
    REAL_OR(cuDeviceGetUuid, CUDA_ERROR_NOT_INITIALIZED);
    if (!visible(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    return real(uuid, dev);
}

CUresult sd_impl_cuDeviceGetUuid_v2(void *caller, CUuuid *uuid, CUdevice dev)
{
    (void)caller;
    REAL_OR(cuDeviceGetUuid_v2, CUDA_ERROR_NOT_INITIALIZED);
    if (!visible(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    return real(uuid, dev);
}

static void count_context(int api, CUdevice dev, int delta)
{
    sd_count_call(api);
    if (sd_slot && dev >= 0 && dev < SD_MAX_DEVICES) {
        if (delta > 0)
            __atomic_fetch_add(&sd_slot->contexts[dev], 1, __ATOMIC_RELAXED);
        else if (__atomic_load_n(&sd_slot->contexts[dev], __ATOMIC_RELAXED))
            __atomic_fetch_sub(&sd_slot->contexts[dev], 1, __ATOMIC_RELAXED);
    }
    sd_event(SD_EV_CONTEXT, api, dev, delta, 0, 0, 0, NULL);
}

/* Per-instance handles (`seedance fix handle-leak --mode per-instance`, SEEDANCE_HANDLES):
 * every library in a process that asks for "the" device context gets the device's primary
 * context, so what one instance leaves behind (modules, streams, memory) lives on inside
 * everybody's context.  In per-instance mode the shim hands out a context of the instance's
 * own instead: created with the first retain, destroyed with the last release, which makes
 * the driver free everything the instance still held.  Not a hot path: a mutex is fine. */
static struct { CUcontext ctx; int refs; } sd_own_ctx[SD_MAX_DEVICES];
static pthread_mutex_t sd_own_lock = PTHREAD_MUTEX_INITIALIZER;

typedef CUresult (*sd_ctx_fn)(CUcontext);
typedef CUresult (*sd_ctx_out_fn)(CUcontext *);

static CUresult own_ctx_retain(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= SD_MAX_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&sd_own_lock);
    if (!sd_own_ctx[dev].ctx) {
        __typeof__(&cuCtxCreate_v2) create = SD_REAL(cuCtxCreate_v2);
        sd_ctx_out_fn get = (sd_ctx_out_fn)sd_real_dlsym(sd_driver_handle(), "cuCtxGetCurrent");
        sd_ctx_fn set = (sd_ctx_fn)sd_real_dlsym(sd_driver_handle(), "cuCtxSetCurrent");
        CUcontext before = NULL;
        if (!create || !get || !set) {
            r = CUDA_ERROR_NOT_INITIALIZED;
        } else if ((r = get(&before)) == CUDA_SUCCESS &&
                   (r = create(&sd_own_ctx[dev].ctx, 0, dev)) == CUDA_SUCCESS) {
            /* a primary-context retain does not make the context current; creating one does */
            set(before);
        }
    }
    if (r == CUDA_SUCCESS) {
        sd_own_ctx[dev].refs++;
        *pctx = sd_own_ctx[dev].ctx;
    }
    pthread_mutex_unlock(&sd_own_lock);
    return r;
}

static CUresult own_ctx_release(CUdevice dev)
{
    if (dev < 0 || dev >= SD_MAX_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&sd_own_lock);
    if (sd_own_ctx[dev].refs <= 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;  /* what the driver says for an unbalanced release */
    } else if (--sd_own_ctx[dev].refs == 0) {
        sd_ctx_fn destroy = (sd_ctx_fn)sd_real_dlsym(sd_driver_handle(), "cuCtxDestroy_v2");
        r = destroy ? destroy(sd_own_ctx[dev].ctx) : CUDA_ERROR_NOT_INITIALIZED;
        sd_own_ctx[dev].ctx = NULL;
    }
    pthread_mutex_unlock(&sd_own_lock);
    return r;
}

CUresult sd_impl_cuDevicePrimaryCtxRetain(void *caller, CUcontext *pctx, CUdevice dev)
{
    (void)caller;
    REAL_OR(cuDevicePrimaryCtxRetain, CUDA_ERROR_NOT_INITIALIZED);
    if (!visible(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = sd_own_handles ? own_ctx_retain(pctx, dev) : real(pctx, dev);
    if (r == CUDA_SUCCESS)
        count_context(SD_HOOK_cuDevicePrimaryCtxRetain, dev, 1);
    return r;
}

CUresult sd_impl_cuDevicePrimaryCtxRelease_v2(void *caller, CUdevice dev)
{
    (void)caller;
    REAL_OR(cuDevicePrimaryCtxRelease_v2, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = sd_own_handles ? own_ctx_release(dev) : real(dev);
    if (r == CUDA_SUCCESS)
        count_context(SD_HOOK_cuDevicePrimaryCtxRelease_v2, dev, -1);
    return r;
}

CUresult sd_impl_cuCtxCreate_v2(void *caller, CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)caller;
    REAL_OR(cuCtxCreate_v2, CUDA_ERROR_NOT_INITIALIZED);
    if (!visible(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = real(pctx, flags, dev);
    if (r == CUDA_SUCCESS)
        count_context(SD_HOOK_cuCtxCreate_v2, dev, 1);
    return r;
}

CUresult sd_impl_cuCtxCreate_v3(void *caller, CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                int numParams, unsigned int flags, CUdevice dev)
{
    (void)caller;
    REAL_OR(cuCtxCreate_v3, CUDA_ERROR_NOT_INITIALIZED);
    if (!visible(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = real(pctx, paramsArray, numParams, flags, dev);
    if (r == CUDA_SUCCESS)
        count_context(SD_HOOK_cuCtxCreate_v3, dev, 1);
    return r;
}

CUresult sd_impl_cuCtxCreate_v4(void *caller, CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                unsigned int flags, CUdevice dev)
{
    (void)caller;
    REAL_OR(cuCtxCreate_v4, CUDA_ERROR_NOT_INITIALIZED);
    if (!visible(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = real(pctx, ctxCreateParams, flags, dev);
    if (r == CUDA_SUCCESS)
        count_context(SD_HOOK_cuCtxCreate_v4, dev, 1);
    return r;
}

/* runtime entry points: the driver hooks underneath do the remap; count only */
cudaError_t sd_impl_cudaSetDevice(void *caller, int device)
{
    (void)caller;
    REAL_OR(cudaSetDevice, cudaErrorInsufficientDriver);
    sd_count_call(SD_HOOK_cudaSetDevice);
    return real(device);
}

cudaError_t sd_impl_cudaGetDeviceCount(void *caller, int *count)
{
    (void)caller;
    REAL_OR(cudaGetDeviceCount, cudaErrorInsufficientDriver);
    sd_count_call(SD_HOOK_cudaGetDeviceCount);
    return real(count);
}
