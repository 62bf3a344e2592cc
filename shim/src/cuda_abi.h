/*
 * cuda_abi.h: the few CUDA driver/runtime types and values the shim needs.
 *
 * The shim must build on machines without a CUDA toolkit (it is compiled at pip install
 * time), so it declares the ABI it relies on itself, with the values documented in
 * cuda.h / driver_types.h.  With -DSD_CHECK_WITH_CUDA_H the real headers are used
 * instead, and the compiler then checks every hook definition against NVIDIA's own
 * prototypes (tests/shim/test_build.py does this when /usr/local/cuda is present).
 */
#ifndef SD_CUDA_ABI_H
#define SD_CUDA_ABI_H

#include <stdint.h>
#include <stddef.h>

#ifdef SD_CHECK_WITH_CUDA_H
#include <cuda.h>
#include <cuda_runtime_api.h>
/* cuda.h renames these to their newest version; the shim defines each version under
 * its exported name, so the rename must not apply to the older ones. */
#undef cuGetProcAddress
#undef cuDeviceGetUuid
#undef cuMemAllocAsync
#undef cuMemAllocFromPoolAsync
#undef cuMemFreeAsync
typedef struct CUexecAffinityParam_st sd_exec_affinity_param;
#else
typedef int CUresult;
typedef int cudaError_t;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUlaunchConfig_st CUlaunchConfig;   /* only passed through by pointer */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;
typedef int CUdriverProcAddressQueryResult;
typedef struct CUmemLocation_st { int type; int id; } CUmemLocation;
typedef struct CUmemAllocationProp_st {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

/* CUresult (cuda.h: enum cudaError_enum) */
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_NOT_FOUND 500
/* cuGetProcAddress flags and CUdriverProcAddressQueryResult */
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2
/* CUmemLocationType */
#define CU_MEM_LOCATION_TYPE_DEVICE 1
/* cudaError_t (driver_types.h) */
#define cudaSuccess 0
#define cudaErrorMemoryAllocation 2
#define cudaErrorInsufficientDriver 35
#endif

#endif
