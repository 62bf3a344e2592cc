/* bench_shim.c: the timed loops of bench/bench_shim.py (driver API via link-time symbols). */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "alloc";
    long n = argc > 2 ? atol(argv[2]) : 1000000;
    if (strcmp(mode, "inittime") == 0) { /* when did cuInit return, on CLOCK_MONOTONIC */
        CUresult r = cuInit(0);
        printf("%d %.0f\n", r, now_ns());
        return r != CUDA_SUCCESS;
    }
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "no device\n");
        return 1;
    }
    double t0, t1;
    if (strcmp(mode, "alloc") == 0) {
        CUdeviceptr p;
        for (long i = 0; i < 1000; i++) { cuMemAlloc_v2(&p, 4096); cuMemFree_v2(p); }
        t0 = now_ns();
        for (long i = 0; i < n; i++) {
            if (cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS)
                return 2;
        }
        t1 = now_ns();
    } else if (strcmp(mode, "uuid") == 0) { /* interposed, not accounted */
        CUuuid u;
        t0 = now_ns();
        for (long i = 0; i < n; i++)
            cuDeviceGetUuid_v2(&u, dev);
        t1 = now_ns();
    } else { /* "current": not interposed at all */
        CUcontext c;
        t0 = now_ns();
        for (long i = 0; i < n; i++)
            cuCtxGetCurrent(&c);
        t1 = now_ns();
    }
    printf("%.3f\n", (t1 - t0) / n);
    return 0;
}
