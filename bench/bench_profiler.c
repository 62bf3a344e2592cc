/*
 * bench_profiler.c: the programs bench_profiler.py times.
 *   launch N   N cuLaunchKernel calls in a loop; prints ns per call (CLOCK_MONOTONIC)
 *   work N     N rounds of: allocate 64 blocks of mixed sizes, free every other one, a
 *              slice of CPU work, free the rest; prints its own wall time in ms, so the
 *              profiler's start-up is not counted, only what it costs the program
 */
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
    CUdevice dev;
    CUcontext ctx;
    if (argc < 3 || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return 1;
    long n = atol(argv[2]);
    if (strcmp(argv[1], "launch") == 0) {
        double t0 = now_ns();
        for (long i = 0; i < n; i++)
            if (cuLaunchKernel((CUfunction)(uintptr_t)0x1000, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL))
                return 2;
        printf("%.3f\n", (now_ns() - t0) / n);
        return 0;
    }
    volatile double sink = 0;
    double t0 = now_ns();
    for (long r = 0; r < n; r++) {
        CUdeviceptr p[64];
        for (int i = 0; i < 64; i++)
            if (cuMemAlloc(&p[i], (size_t)(1 + (i * 7 + r) % 13) << 20))
                return 3;
        for (int i = 0; i < 64; i += 2)
            cuMemFree(p[i]);
        for (int k = 0; k < 200000; k++)
            sink += k * 0.5;
        for (int i = 1; i < 64; i += 2)
            cuMemFree(p[i]);
    }
    printf("%.3f\n", (now_ns() - t0) / 1e6);
    return 0;
}
