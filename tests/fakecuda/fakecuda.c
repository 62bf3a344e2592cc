/*
 * fakecuda.c: a fake CUDA driver (libcuda.so.1) for tests on hosts without a GPU.
 * Build it with -Wl,-Bsymbolic: like the real driver, its calls to its own entry points
 * (and the table cuGetProcAddress answers from) must bind inside it, not to a preloaded shim.
 *
 * The ONE allowed stand-in: it is compiled against NVIDIA's own cuda.h when that is
 * present (so every signature here is checked by the compiler against the real one)
 * and returns the driver's documented error codes.  Each physical device has a fixed
 * virtual address range [FAKE_VA_BASE + i * FAKE_VA_STRIDE, + its memory) and device
 * pointers come from a first-fit allocator over it (aligned to FAKE_ALIGN), so a program
 * that allocates and frees in a fragmenting pattern fragments the fake device as it would
 * a real one (issue 14); the pointers are not backed by host memory.
 * fakecuda_va_range() (not a CUDA entry point) tells the profiler the range.  Devices:
 *   FAKECUDA_DEVICES=N            number of physical devices (default 2)
 *   FAKECUDA_MEM=16G | 8G,4G      memory per device (default 16G)
 *   CUDA_VISIBLE_DEVICES          ordinals, GPU-<uuid> prefixes (MIG- names no fake device)
 *   CUDA_DEVICE_ORDER             FASTEST_FIRST (default: most memory first) or PCI_BUS_ID
 *   FAKECUDA_BUMP=1               benchmarks only: device pointers come from a bump counter
 *                                 and are not backed by memory, so the driver's own cost per
 *                                 allocation is a few ns and the shim's share stands out
 *   FAKECUDA_LEDGER=FILE          test side channel: a shared file the driver updates with,
 *                                 per PHYSICAL device, outstanding bytes, high-water mark,
 *                                 allocation/free counts (struct fake_ledger below), so
 *                                 tests see allocations from the driver's side.
 */
#define _GNU_SOURCE
#if !defined(FAKE_NO_CUDA_H) && __has_include(<cuda.h>)
#include <cuda.h>
#undef cuGetProcAddress
#undef cuDeviceGetUuid
#undef cuDevicePrimaryCtxRelease
#undef cuMemAllocAsync
#undef cuMemAllocFromPoolAsync
#undef cuMemFreeAsync
#undef cuMemAlloc
#define FAKE_HAVE_CUDA_H 1
typedef unsigned int CUdeviceptr_v1; /* cuda.h declares it only for __CUDA_API_VERSION_INTERNAL */
#else
#include "../../shim/src/cuda_abi.h"
typedef unsigned int CUdeviceptr_v1;
typedef int CUdevice_attribute;
struct CUlaunchConfig_st {            /* cuda.h's layout */
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
};
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_INVALID_DEVICE 101
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define FAKE_MAX 16
#define HDR 256
#define FAKE_MAGIC 0xfa4ec0dadeadbeefull

struct fake_ledger {                  /* mirrored in tests/fakecuda/ledger.py */
    uint64_t outstanding[FAKE_MAX];
    uint64_t high_water[FAKE_MAX];
    uint64_t allocs[FAKE_MAX];
    uint64_t frees[FAKE_MAX];
    uint64_t oom[FAKE_MAX];
};

struct fake_ctx {
    int ordinal;      /* the handle the process sees (visible ordinal) */
    int physical;
    int primary;
};

/* Live allocations of one physical device, sorted by address: first fit walks the gaps. */
struct fake_block {
    uint64_t addr;
    uint64_t size;     /* rounded up to FAKE_ALIGN */
    uint64_t asked;    /* the size the caller asked for (cuMemGetAddressRange reports it) */
};

struct fake_space {
    pthread_mutex_t lock;
    struct fake_block *blocks;
    size_t n, cap;
};

#define FAKE_VA_BASE 0x700000000000ull   /* user space, bit 63 clear (the shim tags handles with it) */
#define FAKE_VA_STRIDE (1ull << 40)      /* 1 TiB of address space per device */
#define FAKE_ALIGN 4096ull

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int initialized;
static int nphys = 2;
static uint64_t mem[FAKE_MAX];
static int nvis;
static int vis[FAKE_MAX];             /* visible ordinal -> physical index */
static struct fake_ctx primary[FAKE_MAX];
static int primary_refs[FAKE_MAX];
static struct fake_ledger local_ledger;
static int bump_mode;
static uint64_t bump_next = 0x7e0000000000ull;
#define BUMP_BASE 0x7e0000000000ull
static struct fake_ledger *ledger = &local_ledger;
static __thread struct fake_ctx *current;
static struct fake_space space[FAKE_MAX];

static uint64_t parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'K': case 'k': v <<= 10; break;
    case 'M': case 'm': v <<= 20; break;
    case 'G': case 'g': v <<= 30; break;
    case 'T': case 't': v <<= 40; break;
    default: break;
    }
    return v;
}

static void fake_uuid(int physical, unsigned char *b)
{
    static const unsigned char base[16] = {0x5e, 0xed, 0xfa, 0xce, 0x00, 0x00, 0x40, 0x00,
                                           0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    memcpy(b, base, 16);
    b[15] = (unsigned char)physical;
}

static void uuid_string(int physical, char *out, size_t len)
{
    unsigned char b[16];
    fake_uuid(physical, b);
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int pci_bus(int physical) { return 0x10 + physical * 0x10; }

static void setup(void)
{
    const char *n = getenv("FAKECUDA_DEVICES");
    if (n && *n)
        nphys = atoi(n);
    if (nphys < 0)
        nphys = 0;
    if (nphys > FAKE_MAX)
        nphys = FAKE_MAX;
    uint64_t dflt = 16ull << 30;
    for (int i = 0; i < FAKE_MAX; i++) {
        mem[i] = dflt;
        pthread_mutex_init(&space[i].lock, NULL);
    }
    const char *m = getenv("FAKECUDA_MEM");
    if (m && *m) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", m);
        int i = 0;
        uint64_t last = dflt;
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (i < FAKE_MAX)
                mem[i++] = last = parse_size(tok);
        for (; i < FAKE_MAX; i++)
            mem[i] = last;
    }
    for (int i = 0; i < FAKE_MAX; i++)
        if (mem[i] > FAKE_VA_STRIDE)
            mem[i] = FAKE_VA_STRIDE;
    bump_mode = getenv("FAKECUDA_BUMP") && strcmp(getenv("FAKECUDA_BUMP"), "1") == 0;
    const char *path = getenv("FAKECUDA_LEDGER");
    if (path && *path) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0 && ftruncate(fd, sizeof(struct fake_ledger)) == 0) {
            void *p = mmap(NULL, sizeof(struct fake_ledger), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED)
                ledger = p;
        }
        if (fd >= 0)
            close(fd);
    }
    /* enumeration order: PCI_BUS_ID, or fastest first (here: most memory first) */
    int order[FAKE_MAX];
    for (int i = 0; i < nphys; i++)
        order[i] = i;
    const char *devorder = getenv("CUDA_DEVICE_ORDER");
    if (!devorder || strcmp(devorder, "PCI_BUS_ID") != 0)
        for (int i = 1; i < nphys; i++)
            for (int j = i; j > 0 && mem[order[j]] > mem[order[j - 1]]; j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd) {
        nvis = nphys;
        memcpy(vis, order, sizeof(int) * (size_t)nphys);
    } else {
        /* the driver's grammar: stop at the first entry that names no device, or a repeat */
        char buf[512];
        snprintf(buf, sizeof buf, "%s", cvd);
        nvis = 0;
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            while (*tok == ' ')
                tok++;
            int phys = -1;
            if (*tok >= '0' && *tok <= '9') {
                char *end;
                long v = strtol(tok, &end, 10);
                if (*end == '\0' && v < nphys)
                    phys = order[v];
            } else if (strncasecmp(tok, "GPU-", 4) == 0) {
                for (int i = 0; i < nphys; i++) {
                    char u[64];
                    uuid_string(i, u, sizeof u);
                    if (strncasecmp(u, tok, strlen(tok)) == 0) {
                        if (phys >= 0) { phys = -1; break; }
                        phys = i;
                    }
                }
            }
            int dup = 0;
            for (int k = 0; k < nvis; k++)
                dup |= vis[k] == phys;
            if (phys < 0 || dup)
                break;
            vis[nvis++] = phys;
        }
    }
    for (int i = 0; i < nvis; i++) {
        primary[i].ordinal = i;
        primary[i].physical = vis[i];
        primary[i].primary = 1;
    }
}

#define NEED_INIT()                     \
    do {                                \
        if (!initialized)               \
            return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)
#define NEED_DEV(d)                     \
    do {                                \
        NEED_INIT();                    \
        if ((d) < 0 || (d) >= nvis)     \
            return CUDA_ERROR_INVALID_DEVICE; \
    } while (0)

EXPORT CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&once, setup);
    if (nvis == 0)
        return CUDA_ERROR_NO_DEVICE;
    initialized = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    const char *s = getenv("FAKECUDA_DRIVER_VERSION");
    *v = s && *s ? atoi(s) : 13000;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    NEED_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = nvis;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    NEED_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= nvis)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    NEED_DEV(dev);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "Fake CUDA Device %d", vis[dev]);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    NEED_DEV(dev);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    fake_uuid(vis[dev], (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid(uuid, dev);
}

EXPORT CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    NEED_DEV(dev);
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(pciBusId, (size_t)len, "00000000:%02X:00.0", pci_bus(vis[dev]));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    NEED_INIT();
    if (!dev || !pciBusId)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned domain = 0, bus = 0, device = 0, function = 0;
    /* accepts [domain]:[bus]:[device].[function] and [bus]:[device].[function] */
    if (sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) {
        domain = 0;
        if (sscanf(pciBusId, "%x:%x.%x", &bus, &device, &function) != 3)
            return CUDA_ERROR_INVALID_VALUE;
    }
    for (int i = 0; i < nvis; i++)
        if ((unsigned)pci_bus(vis[i]) == bus && domain == 0 && device == 0) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    NEED_DEV(dev);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = mem[vis[dev]];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    NEED_DEV(dev);
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    switch ((int)attrib) {
    case 16: *pi = 132; break;                 /* MULTIPROCESSOR_COUNT */
    case 33: *pi = pci_bus(vis[dev]); break;   /* PCI_BUS_ID */
    case 34: *pi = 0; break;                   /* PCI_DEVICE_ID */
    case 50: *pi = 0; break;                   /* PCI_DOMAIN_ID */
    case 75: *pi = 9; break;                   /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *pi = 0; break;                   /* COMPUTE_CAPABILITY_MINOR */
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    NEED_DEV(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&primary_refs[dev], 1, __ATOMIC_RELAXED);
    *pctx = (CUcontext)&primary[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    NEED_DEV(dev);
    if (__atomic_load_n(&primary_refs[dev], __ATOMIC_RELAXED) <= 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    __atomic_fetch_sub(&primary_refs[dev], 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

static CUresult new_ctx(CUcontext *pctx, CUdevice dev)
{
    NEED_DEV(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->ordinal = dev;
    c->physical = vis[dev];
    current = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return new_ctx(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                               unsigned int flags, CUdevice dev)
{
    (void)paramsArray;
    (void)numParams;
    (void)flags;
    return new_ctx(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev)
{
    (void)ctxCreateParams;
    (void)flags;
    return new_ctx(pctx, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    NEED_INIT();
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    if (!c || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (current == c)
        current = NULL;
    free(c);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    NEED_INIT();
    current = (struct fake_ctx *)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    NEED_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = current->ordinal;
    return CUDA_SUCCESS;
}

/* ---- memory --------------------------------------------------------------- */

static int reserve(int phys, uint64_t size)
{
    uint64_t cur = __atomic_load_n(&ledger->outstanding[phys], __ATOMIC_RELAXED);
    do {
        if (size > mem[phys] || cur > mem[phys] - size) {
            __atomic_fetch_add(&ledger->oom[phys], 1, __ATOMIC_RELAXED);
            return 0;
        }
    } while (!__atomic_compare_exchange_n(&ledger->outstanding[phys], &cur, cur + size, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
    uint64_t now = cur + size, hw = __atomic_load_n(&ledger->high_water[phys], __ATOMIC_RELAXED);
    while (now > hw && !__atomic_compare_exchange_n(&ledger->high_water[phys], &hw, now, 1, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED))
        ;
    __atomic_fetch_add(&ledger->allocs[phys], 1, __ATOMIC_RELAXED);
    return 1;
}

static void unreserve(int phys, uint64_t size)
{
    __atomic_fetch_sub(&ledger->outstanding[phys], size, __ATOMIC_ACQ_REL);
    __atomic_fetch_add(&ledger->frees[phys], 1, __ATOMIC_RELAXED);
}

/* First fit over [base, base + mem): the lowest gap between live blocks that holds the
 * request.  The ledger's reservation stays the accounting of record (tests read it); the
 * address space can still refuse a request that the free total would hold: fragmentation. */
static int space_place(int phys, uint64_t size, uint64_t *addr)
{
    struct fake_space *sp = &space[phys];
    uint64_t base = FAKE_VA_BASE + (uint64_t)phys * FAKE_VA_STRIDE, end = base + mem[phys];
    uint64_t cursor = base;
    size_t i = 0;
    for (; i < sp->n; i++) {
        if (sp->blocks[i].addr - cursor >= size)
            break;
        cursor = sp->blocks[i].addr + sp->blocks[i].size;
    }
    if (i == sp->n && (cursor > end || end - cursor < size))
        return -1;
    if (sp->n == sp->cap) {
        size_t cap = sp->cap ? sp->cap * 2 : 64;
        struct fake_block *grown = realloc(sp->blocks, cap * sizeof *grown);
        if (!grown)
            return -1;
        sp->blocks = grown;
        sp->cap = cap;
    }
    memmove(&sp->blocks[i + 1], &sp->blocks[i], (sp->n - i) * sizeof *sp->blocks);
    sp->blocks[i].addr = cursor;
    sp->blocks[i].size = size;
    sp->n++;
    *addr = cursor;
    return (int)i;
}

/* index of the block that contains d (exact start when exact), -1 none; lock held */
static long space_find(int phys, CUdeviceptr d, int exact)
{
    struct fake_space *sp = &space[phys];
    size_t lo = 0, hi = sp->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (sp->blocks[mid].addr <= d)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    struct fake_block *b = &sp->blocks[lo - 1];
    if (exact ? b->addr != d : d - b->addr >= b->size)
        return -1;
    return (long)(lo - 1);
}

static int phys_of(CUdeviceptr d)
{
    if (d < FAKE_VA_BASE)
        return -1;
    uint64_t phys = (d - FAKE_VA_BASE) / FAKE_VA_STRIDE;
    return phys < (uint64_t)nphys ? (int)phys : -1;
}

static CUresult alloc_on(int phys, CUdeviceptr *dptr, size_t size)
{
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bump_mode) {
        *dptr = __atomic_fetch_add(&bump_next, (size + HDR - 1) & ~(uint64_t)(HDR - 1), __ATOMIC_RELAXED);
        return CUDA_SUCCESS;
    }
    if (!reserve(phys, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t rounded = (size + FAKE_ALIGN - 1) & ~(FAKE_ALIGN - 1), addr = 0;
    pthread_mutex_lock(&space[phys].lock);
    int at = space_place(phys, rounded, &addr);
    if (at >= 0)
        space[phys].blocks[at].asked = size;
    pthread_mutex_unlock(&space[phys].lock);
    if (at < 0) {
        unreserve(phys, size);
        __atomic_fetch_add(&ledger->oom[phys], 1, __ATOMIC_RELAXED);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = (CUdeviceptr)addr;
    return CUDA_SUCCESS;
}

/* Not a CUDA entry point: the device's address range, for seedance's memory profiler. */
EXPORT int fakecuda_va_range(int physical, unsigned long long *base, unsigned long long *size)
{
    pthread_once(&once, setup);
    if (physical < 0 || physical >= nphys || !base || !size)
        return -1;
    *base = FAKE_VA_BASE + (uint64_t)physical * FAKE_VA_STRIDE;
    *size = mem[physical];
    return 0;
}

static CUresult alloc_current(CUdeviceptr *dptr, size_t size)
{
    NEED_INIT();
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    return alloc_on(current->physical, dptr, size);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { return alloc_current(dptr, bytesize); }

/* the 32-bit CUDA 2.x entry point: nothing modern may end up here */
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    (void)dptr;
    (void)bytesize;
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                   unsigned int ElementSizeBytes)
{
    if (!pPitch || (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) & ~(size_t)511;
    CUresult r = alloc_current(dptr, pitch * Height);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    (void)flags;
    return alloc_current(dptr, bytesize);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    (void)hStream;
    return alloc_current(dptr, bytesize);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return cuMemAllocAsync(dptr, bytesize, hStream);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    (void)pool;
    (void)hStream;
    return alloc_current(dptr, bytesize);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    NEED_INIT();
    if (bump_mode && dptr >= BUMP_BASE)
        return CUDA_SUCCESS;
    int phys = phys_of(dptr);
    if (phys < 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_space *sp = &space[phys];
    pthread_mutex_lock(&sp->lock);
    long at = space_find(phys, dptr, 1);
    uint64_t asked = 0;
    if (at >= 0) {
        asked = sp->blocks[at].asked;
        memmove(&sp->blocks[at], &sp->blocks[at + 1], (sp->n - (size_t)at - 1) * sizeof *sp->blocks);
        sp->n--;
    }
    pthread_mutex_unlock(&sp->lock);
    if (at < 0)
        return CUDA_ERROR_INVALID_VALUE;
    unreserve(phys, asked);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    (void)hStream;
    return cuMemFree_v2(dptr);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return cuMemFreeAsync(dptr, hStream);
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    NEED_INIT();
    int phys = phys_of(dptr);
    if (phys < 0)
        return CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&space[phys].lock);
    long at = space_find(phys, dptr, 0);
    struct fake_block b = at >= 0 ? space[phys].blocks[at] : (struct fake_block){0, 0, 0};
    pthread_mutex_unlock(&space[phys].lock);
    if (at < 0)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = b.addr;
    if (psize)
        *psize = b.asked;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_, size_t *total)
{
    NEED_INIT();
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    int p = current->physical;
    uint64_t used = __atomic_load_n(&ledger->outstanding[p], __ATOMIC_RELAXED);
    if (free_)
        *free_ = used < mem[p] ? mem[p] - used : 0;
    if (total)
        *total = mem[p];
    return CUDA_SUCCESS;
}

struct fake_handle {
    uint64_t size;
    int physical;    /* -1: host memory */
};

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    NEED_INIT();
    if (!handle || !prop || flags != 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int phys = -1;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (prop->location.id < 0 || prop->location.id >= nvis)
            return CUDA_ERROR_INVALID_DEVICE;
        phys = vis[prop->location.id];
        if (!reserve(phys, size))
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fake_handle *h = malloc(sizeof *h);
    if (!h) {
        if (phys >= 0)
            unreserve(phys, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->size = size;
    h->physical = phys;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    NEED_INIT();
    struct fake_handle *h = (struct fake_handle *)(uintptr_t)handle;
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    if (h->physical >= 0)
        unreserve(h->physical, h->size);
    free(h);
    return CUDA_SUCCESS;
}

/* ---- launches ------------------------------------------------------------ */
/* Nothing runs: a launch checks its arguments as the driver documents and counts.  Any
 * non-NULL function/graph handle is accepted (the fake has no modules). */
static uint64_t launches;

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                               unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                               unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    (void)sharedMemBytes, (void)hStream, (void)kernelParams, (void)extra;
    NEED_INIT();
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gridDimX || !gridDimY || !gridDimZ || !blockDimX || !blockDimY || !blockDimZ)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&launches, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return cuLaunchKernel(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                          config->blockDimY, config->blockDimZ, config->sharedMemBytes, config->hStream,
                          kernelParams, extra);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                          unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                          unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                          void **kernelParams)
{
    return cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                          hStream, kernelParams, NULL);
}

EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    (void)hStream;
    NEED_INIT();
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!hGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&launches, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    switch ((int)error) {
    case 0: *pStr = "no error"; break;
    case 1: *pStr = "invalid argument"; break;
    case 2: *pStr = "out of memory"; break;
    case 3: *pStr = "initialization error"; break;
    case 100: *pStr = "no CUDA-capable device is detected"; break;
    case 101: *pStr = "invalid device ordinal"; break;
    case 201: *pStr = "invalid device context"; break;
    case 500: *pStr = "named symbol not found"; break;
    case 801: *pStr = "operation not supported"; break;
    default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    switch ((int)error) {
    case 0: *pStr = "CUDA_SUCCESS"; break;
    case 1: *pStr = "CUDA_ERROR_INVALID_VALUE"; break;
    case 2: *pStr = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case 3: *pStr = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case 100: *pStr = "CUDA_ERROR_NO_DEVICE"; break;
    case 101: *pStr = "CUDA_ERROR_INVALID_DEVICE"; break;
    case 201: *pStr = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case 500: *pStr = "CUDA_ERROR_NOT_FOUND"; break;
    case 801: *pStr = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ------------------------------------------------------ */

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *symbolStatus);
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

struct proc_entry {
    const char *name;
    int version;
    int ptsz;
    void *fn;
};

/* (name, first cudaVersion, per-thread stream) -> entry point, as in cudaTypedefs.h */
static const struct proc_entry procs[] = {
    {"cuInit", 2000, 0, (void *)cuInit},
    {"cuDriverGetVersion", 2020, 0, (void *)cuDriverGetVersion},
    {"cuDeviceGet", 2000, 0, (void *)cuDeviceGet},
    {"cuDeviceGetCount", 2000, 0, (void *)cuDeviceGetCount},
    {"cuDeviceGetName", 2000, 0, (void *)cuDeviceGetName},
    {"cuDeviceGetUuid", 9020, 0, (void *)cuDeviceGetUuid},
    {"cuDeviceGetUuid", 11040, 0, (void *)cuDeviceGetUuid_v2},
    {"cuDeviceGetPCIBusId", 4010, 0, (void *)cuDeviceGetPCIBusId},
    {"cuDeviceGetByPCIBusId", 4010, 0, (void *)cuDeviceGetByPCIBusId},
    {"cuDeviceTotalMem", 3020, 0, (void *)cuDeviceTotalMem_v2},
    {"cuDeviceGetAttribute", 2000, 0, (void *)cuDeviceGetAttribute},
    {"cuDevicePrimaryCtxRetain", 7000, 0, (void *)cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", 7000, 0, (void *)cuDevicePrimaryCtxRelease},
    {"cuDevicePrimaryCtxRelease", 11000, 0, (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuCtxCreate", 3020, 0, (void *)cuCtxCreate_v2},
    {"cuCtxCreate", 11040, 0, (void *)cuCtxCreate_v3},
    {"cuCtxCreate", 12050, 0, (void *)cuCtxCreate_v4},
    {"cuCtxDestroy", 4000, 0, (void *)cuCtxDestroy_v2},
    {"cuCtxSetCurrent", 4000, 0, (void *)cuCtxSetCurrent},
    {"cuCtxGetCurrent", 4000, 0, (void *)cuCtxGetCurrent},
    {"cuCtxGetDevice", 2000, 0, (void *)cuCtxGetDevice},
    {"cuMemAlloc", 2000, 0, (void *)cuMemAlloc},
    {"cuMemAlloc", 3020, 0, (void *)cuMemAlloc_v2},
    {"cuMemAllocPitch", 3020, 0, (void *)cuMemAllocPitch_v2},
    {"cuMemAllocManaged", 6000, 0, (void *)cuMemAllocManaged},
    {"cuMemAllocAsync", 11020, 0, (void *)cuMemAllocAsync},
    {"cuMemAllocAsync", 11020, 1, (void *)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, 0, (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocFromPoolAsync", 11020, 1, (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFree", 3020, 0, (void *)cuMemFree_v2},
    {"cuMemFreeAsync", 11020, 0, (void *)cuMemFreeAsync},
    {"cuMemFreeAsync", 11020, 1, (void *)cuMemFreeAsync_ptsz},
    {"cuMemGetAddressRange", 3020, 0, (void *)cuMemGetAddressRange_v2},
    {"cuMemGetInfo", 3020, 0, (void *)cuMemGetInfo_v2},
    {"cuMemCreate", 10020, 0, (void *)cuMemCreate},
    {"cuMemRelease", 10020, 0, (void *)cuMemRelease},
    {"cuLaunchKernel", 4000, 0, (void *)cuLaunchKernel},
    {"cuLaunchKernelEx", 11060, 0, (void *)cuLaunchKernelEx},
    {"cuLaunchCooperativeKernel", 9000, 0, (void *)cuLaunchCooperativeKernel},
    {"cuGraphLaunch", 10000, 0, (void *)cuGraphLaunch},
    {"cuGetErrorString", 6000, 0, (void *)cuGetErrorString},
    {"cuGetErrorName", 6000, 0, (void *)cuGetErrorName},
    {"cuGetProcAddress", 11030, 0, (void *)cuGetProcAddress},
    {"cuGetProcAddress", 12000, 0, (void *)cuGetProcAddress_v2},
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *symbolStatus)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct proc_entry *best = NULL, *best_ptsz = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof procs / sizeof *procs; i++) {
        if (strcmp(procs[i].name, symbol) != 0)
            continue;
        known = 1;
        if (procs[i].version > cudaVersion)
            continue;
        if (procs[i].ptsz) {
            if (ptsz && (!best_ptsz || best_ptsz->version < procs[i].version))
                best_ptsz = &procs[i];
        } else if (!best || best->version < procs[i].version) {
            best = &procs[i];
        }
    }
    if (best_ptsz)
        best = best_ptsz;
    if (!best) {
        if (symbolStatus)
            *symbolStatus = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = best->fn;
    if (symbolStatus)
        *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
