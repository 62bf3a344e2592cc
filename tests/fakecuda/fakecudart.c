/*
 * fakecudart.c: a stand-in for the few libcudart entry points the shim interposes
 * (cudaMalloc, cudaFree, cudaSetDevice, cudaGetDeviceCount), built as libcudart.so.12.
 * Like the real runtime it loads the driver with dlopen(RTLD_LOCAL) and fetches every
 * driver entry point through cuGetProcAddress_v2, so the shim sees the runtime's driver
 * calls only through that path.  Error codes are driver_types.h's.
 *
 * Why a stand-in at all (issue 17): the real runtime refuses the fake driver.  Measured
 * with libcudart.so.12 12.9.79 from the nvidia-cuda-runtime-cu12 wheel over
 * tests/fakecuda/fakecuda.c: it dlsyms only cuGetProcAddress_v2, then asks it for 419
 * entry points (the fake answers about 40), and every runtime call returns 36,
 * cudaErrorCallRequiresNewerDriver.  The one answer that decides it is cuGetExportTable:
 * with a stub for every other missing entry point it is still 36; with a stub for
 * cuGetExportTable alone, the runtime gets past the check and returns the stub's error
 * instead (801).  cuGetExportTable hands the runtime NVIDIA-private function tables,
 * keyed by undocumented UUIDs, whose layouts no public header describes, so no fake
 * driver can satisfy it honestly.  (Not cudaErrorInsufficientDriver, 35: the fake's
 * cuDriverGetVersion says 13000, newer than the runtime.)
 * tests/shim/test_build.py::test_real_runtime_still_refuses_the_fake_driver keeps this
 * reason checked; tests/gpu/test_shim_gpu.py runs the same paths (sdrt.c) through the
 * real runtime on a real driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef int cudaError_t;
typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, int *);

#define EXPORT __attribute__((visibility("default")))
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInvalidDevice = 101,
       cudaErrorInsufficientDriver = 35 };

static struct {
    CUresult (*init)(unsigned);
    CUresult (*count)(int *);
    CUresult (*get)(CUdevice *, int);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*setcur)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
} drv;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int loaded;
static __thread int have_ctx;

static void load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    gpa_t gpa = h ? (gpa_t)dlsym(h, "cuGetProcAddress_v2") : NULL;
    int st;
    if (!gpa)
        return;
    gpa("cuInit", (void **)&drv.init, 12080, 0, &st);
    gpa("cuDeviceGetCount", (void **)&drv.count, 12080, 0, &st);
    gpa("cuDeviceGet", (void **)&drv.get, 12080, 0, &st);
    gpa("cuDevicePrimaryCtxRetain", (void **)&drv.retain, 12080, 0, &st);
    gpa("cuCtxSetCurrent", (void **)&drv.setcur, 12080, 0, &st);
    gpa("cuMemAlloc", (void **)&drv.alloc, 12080, 0, &st);
    gpa("cuMemFree", (void **)&drv.free, 12080, 0, &st);
    loaded = drv.init && drv.init(0) == 0;
}

static cudaError_t set_device(int ordinal)
{
    CUdevice d;
    CUcontext c;
    if (drv.get(&d, ordinal) != 0 || drv.retain(&c, d) != 0 || drv.setcur(c) != 0)
        return cudaErrorInvalidDevice;
    have_ctx = 1;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    pthread_once(&once, load);
    if (!loaded)
        return cudaErrorInsufficientDriver;
    return drv.count(count) == 0 ? cudaSuccess : cudaErrorInvalidValue;
}

EXPORT cudaError_t cudaSetDevice(int device)
{
    pthread_once(&once, load);
    return loaded ? set_device(device) : cudaErrorInsufficientDriver;
}

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    pthread_once(&once, load);
    if (!loaded)
        return cudaErrorInsufficientDriver;
    if (!have_ctx && set_device(0) != cudaSuccess)
        return cudaErrorInvalidDevice;
    CUdeviceptr p;
    CUresult r = drv.alloc(&p, size);
    if (r == 2)
        return cudaErrorMemoryAllocation;
    if (r != 0)
        return cudaErrorInvalidValue;
    *devPtr = (void *)(size_t)p;
    return cudaSuccess;
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
    pthread_once(&once, load);
    if (!loaded)
        return cudaErrorInsufficientDriver;
    return devPtr && drv.free((CUdeviceptr)(size_t)devPtr) != 0 ? cudaErrorInvalidValue : cudaSuccess;
}
