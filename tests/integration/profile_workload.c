/*
 * profile_workload.c: programs the profiler tests run on the fake driver (issue 14).
 *   fragment   fill 31 blocks of 32 MiB (of a 1 GiB device), free the even ones, hold the
 *              holes for 300 ms (or argv[2] ms, printing its pid first), free the rest:
 *              a known fragmenting pattern
 *   storm      1000 back-to-back launches from libstorm_a.so, then 10 launches 10 ms
 *              apart from libstorm_b.so (built from this file with -DSTORM_LIB=a|b)
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <time.h>

#ifdef STORM_LIB
/* the launching library: its return addresses attribute the launches to it */
#define STORM_NAME_(x) storm_##x
#define STORM_NAME(x) STORM_NAME_(x)
int STORM_NAME(STORM_LIB)(int n, long gap_us)
{
    for (int i = 0; i < n; i++) {
        CUresult r = cuLaunchKernel((CUfunction)(uintptr_t)0x1000, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        if (r != CUDA_SUCCESS)
            return r;
        if (gap_us) {
            struct timespec ts = {gap_us / 1000000, (gap_us % 1000000) * 1000};
            nanosleep(&ts, NULL);
        }
    }
    return 0;
}
#else
int storm_a(int n, long gap_us);
int storm_b(int n, long gap_us);

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "no device\n");
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "fragment") == 0) {
        long hold = argc > 2 ? atol(argv[2]) : 300;
        if (argc > 2) {
            printf("pid %d\n", (int)getpid());
            fflush(stdout);
        }
        CUdeviceptr p[31];
        for (int i = 0; i < 31; i++)
            if (cuMemAlloc(&p[i], 32u << 20)) {
                fprintf(stderr, "alloc %d failed\n", i);
                return 1;
            }
        pause_ms(100);
        for (int i = 0; i < 31; i += 2)
            cuMemFree(p[i]);
        pause_ms(hold);
        for (int i = 1; i < 31; i += 2)
            cuMemFree(p[i]);
        pause_ms(100);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "storm") == 0) {
        if (storm_a(1000, 0))
            return 2;
        pause_ms(100);
        if (storm_b(10, 10000))
            return 3;
        return 0;
    }
    fprintf(stderr, "usage: %s fragment|storm\n", argv[0]);
    return 2;
}
#endif
