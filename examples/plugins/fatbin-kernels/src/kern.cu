// seedance-build: -gencode arch=compute_75,code=sm_75 -cudart shared
// A trivial kernel; what matters is the fatbin nvcc embeds (sm_75 SASS only).
__global__ void scale(float *x, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] *= a;
}

extern "C" int kern_scale(float *x, float a, int n)
{
    scale<<<(n + 255) / 256, 256>>>(x, a, n);
    return 0;
}
