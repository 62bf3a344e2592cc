/* sdrt.c: a CUDA runtime client (links libcudart.so.12): count, then cudaMalloc/cudaFree
 * sizes given as arguments; a size prefixed with 'k' is kept (never freed). */
#include <stdio.h>
#include <stdlib.h>

typedef int cudaError_t;
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);

int main(int argc, char **argv)
{
    int n = -1;
    cudaError_t r = cudaGetDeviceCount(&n);
    printf("count result=%d count=%d\n", r, n);
    printf("setdevice result=%d\n", cudaSetDevice(0));
    for (int i = 1; i < argc; i++) {
        int keep = argv[i][0] == 'k';
        void *p = NULL;
        r = cudaMalloc(&p, strtoull(argv[i] + keep, NULL, 10));
        printf("malloc result=%d\n", r);
        if (r == 0 && !keep)
            printf("free result=%d\n", cudaFree(p));
    }
    return 0;
}
