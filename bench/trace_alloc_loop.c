/* The workload of bench/bench_trace.py: N cuMemAlloc_v2 then N cuMemFree_v2 through the
 * driver API, timed inside the program so start-up and tracer set-up are not counted.
 * Prints "alloc_ns <per call> free_ns <per call>". */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr *ptrs = calloc(n, sizeof(*ptrs));
    if (!ptrs || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return 2;
    /* warm-up: first calls fault in pages and fill caches */
    for (int i = 0; i < n / 10; i++) {
        if (cuMemAlloc_v2(&ptrs[i], 256))
            return 3;
        cuMemFree_v2(ptrs[i]);
    }
    double t0 = now_ns();
    for (int i = 0; i < n; i++)
        if (cuMemAlloc_v2(&ptrs[i], 256))
            return 3;
    double t1 = now_ns();
    for (int i = 0; i < n; i++)
        cuMemFree_v2(ptrs[i]);
    double t2 = now_ns();
    printf("alloc_ns %.1f free_ns %.1f\n", (t1 - t0) / n, (t2 - t1) / n);
    return 0;
}
