/* Allocates device memory through the driver API and exits without freeing some of it.
 * argv: device ordinal, then sizes; a size prefixed with '-' is freed again before exit.
 * Prints the bytes it leaves allocated, so the test compares against the program's own
 * account as well as against the arguments. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext ctx;
    unsigned long long leaked = 0;
    int ordinal = argc > 1 ? atoi(argv[1]) : 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "leaky: no device %d\n", ordinal);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        int give_back = argv[i][0] == '-';
        size_t bytes = strtoull(argv[i] + give_back, NULL, 0);
        CUdeviceptr ptr;
        if (cuMemAlloc(&ptr, bytes) != CUDA_SUCCESS) {
            fprintf(stderr, "leaky: cuMemAlloc(%zu) failed\n", bytes);
            return 3;
        }
        if (give_back)
            cuMemFree(ptr);
        else
            leaked += bytes;
    }
    printf("leaked %llu\n", leaked);
    return 0;  /* no cuMemFree, no cuDevicePrimaryCtxRelease: the driver reclaims at exit */
}
